import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Ranks  # noqa: E402

_pools = {}


def pytest_addoption(parser):
    parser.addoption("--ranks", default="1,2,3,4", help="world sizes to test (comma list)")


def pytest_generate_tests(metafunc):
    if "ranks" in metafunc.fixturenames:
        sizes = [int(x) for x in metafunc.config.getoption("--ranks").split(",")]
        metafunc.parametrize("ranks", sizes, indirect=True, ids=[f"n{n}" for n in sizes])


@pytest.fixture
def ranks(request):
    """A session-wide group of `n` worker processes (see harness.Ranks)."""
    n = request.param
    if n not in _pools:
        _pools[n] = Ranks(n, timeout=60.0)
    return _pools[n]


def pytest_sessionfinish(session, exitstatus):
    for p in _pools.values():
        p.close()
    _pools.clear()
