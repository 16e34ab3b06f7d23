//! Tests of `tutti sim`: the cluster file, the model's monotonicity, the
//! what-ifs.

use super::cluster::{resolve, Cluster, PRESETS};
use super::price;
use super::workload::{step_time, Workload};
use tutti::{Algorithm, Collective};

#[test]
fn every_preset_parses_and_checks() {
    for p in PRESETS {
        let c = Cluster::parse(p.toml).unwrap();
        c.check().unwrap_or_else(|e| panic!("{}: {e}", p.name));
        // And survives a round trip through the file format.
        let again = Cluster::parse(&c.to_toml().unwrap()).unwrap();
        assert_eq!(again, c, "{}", p.name);
    }
}

/// The fabric simulation against the run-time cost model
/// (`tune::cost::predict`) where both apply (one port per host, no
/// oversubscription): every algorithm finishes, and the two agree within
/// a factor of two.
#[test]
fn fabric_finishes_every_algorithm_and_tracks_the_tuner() {
    let c = resolve("2x8-eth100").unwrap().check().unwrap();
    let c = super::with_hosts(&c, 2);
    let c = super::cluster::Checked { per_host: 4, ..c };
    for &alg in &Algorithm::VARIANTS {
        for count in [1usize, 1000, 1 << 18] {
            let p = price::problem(&c, Collective::AllReduce, count, 1);
            let Some(s) = price::price_one(&c, Collective::AllReduce, count, 4, alg, 1) else {
                continue;
            };
            assert!(s.us.is_finite(), "{alg} {count}: {s:?}");
            let host_of = c.fabric().host_of;
            let class = |a: usize, b: usize| {
                if host_of[a] == host_of[b] {
                    tutti::tune::LinkClass::Shm
                } else {
                    tutti::tune::LinkClass::Tcp
                }
            };
            let t = tutti::tune::cost::predict(&c.model, &p, alg, 4, &class).unwrap();
            let r = s.us / t;
            println!("{alg} {count}: fabric {:.1} us, tuner {t:.1} us", s.us);
            assert!(
                (0.5..2.0).contains(&r),
                "{alg} {count}: fabric {} tuner {t}",
                s.us
            );
        }
    }
}

const GOOD: &str = "hosts = 2\nranks_per_host = 4\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 10\nlatency_us = 20\nports = 2\n";

/// The error of `text`, which must name `field`.
fn rejects(text: &str, field: &str) {
    let e = Cluster::parse(text)
        .and_then(|c| c.check().map(|_| ()))
        .expect_err(text);
    assert!(e.contains(field), "{e:?} should name {field}");
    assert!(
        e.contains("allowed") || e.contains("unknown field"),
        "{e:?}"
    );
}

#[test]
fn parser_reads_toml_and_json_alike() {
    let t = Cluster::parse(GOOD).unwrap();
    let j = Cluster::parse(
        r#"{"hosts": 2, "ranks_per_host": 4, "host": {"bandwidth_gbit": 64, "latency_us": 0.3},
            "network": {"bandwidth_gbit": 10, "latency_us": 20, "ports": 2}}"#,
    )
    .unwrap();
    assert_eq!(t, j);
    let c = t.check().unwrap();
    assert_eq!((c.hosts, c.per_host, c.ports), (2, 4, 2));
    assert_eq!(c.port_gbps, 10.0 / 8.0);
    assert_eq!(c.model.tcp.alpha_us, 20.0);
}

#[test]
fn parser_names_the_bad_field() {
    rejects(
        &GOOD.replace("bandwidth_gbit = 10\n", ""),
        "network.bandwidth_gbit",
    );
    rejects(
        &GOOD.replace("bandwidth_gbit = 10", "bandwidth_gbit = -10"),
        "network.bandwidth_gbit",
    );
    rejects(
        &GOOD.replace("bandwidth_gbit = 64", "bandwidth_gbit = 0"),
        "host.bandwidth_gbit",
    );
    rejects(
        &GOOD.replace("ranks_per_host = 4", "ranks_per_host = 0"),
        "ranks_per_host",
    );
    rejects(&GOOD.replace("hosts = 2\n", ""), "hosts");
    rejects(&GOOD.replace("ports = 2", "ports = 0"), "network.ports");
    rejects(
        &GOOD.replace("ports = 2", "oversubscription = 0.5"),
        "network.oversubscription",
    );
    rejects(
        &GOOD.replace("latency_us = 20", "latency_us = -1"),
        "network.latency_us",
    );
    rejects(&GOOD.replace("ports = 2", "nics = 2"), "nics");
    rejects(
        &GOOD.replace("ports = 2", "burst_kib = 256"),
        "network.line_gbit",
    );
    rejects(
        &GOOD.replace("ports = 2", "burst_kib = -1\nline_gbit = 10"),
        "network.burst_kib",
    );
    let two_hosts_no_net = GOOD.split("[network]").next().unwrap().to_string();
    rejects(&two_hosts_no_net, "network");
    let e = resolve("no-such-preset").unwrap_err();
    assert!(e.contains("presets:") && e.contains("2x8-eth100"), "{e}");
}

fn resnet(compute_ms: f64) -> Workload {
    Workload {
        params: 25_557_032,
        grad_elem: 4,
        wire_elem: 4,
        compute_us: compute_ms * 1e3,
        bucket_bytes: 25 << 20,
        overlap: true,
        sparsify: 1.0,
        accum: 1,
    }
}

/// A faster link (network or host, bandwidth or latency) never predicts a
/// slower step, on every preset with several hosts, overlapped or not.
#[test]
fn a_faster_link_never_predicts_a_slower_step() {
    for name in ["2x8-eth100", "2x8-roce200", "4x8-eth100", "ns-1g"] {
        let c = resolve(name).unwrap().check().unwrap();
        for overlap in [true, false] {
            let w = Workload {
                overlap,
                ..resnet(50.0)
            };
            let base = step_time(&c, &w, None).unwrap().step_us;
            let mut net = c.clone();
            net.port_gbps *= 2.0;
            net.model.tcp.gbps *= 2.0;
            let mut nics = c.clone();
            nics.ports *= 2;
            let mut lat = c.clone();
            lat.model.tcp.alpha_us /= 2.0;
            let mut host = c.clone();
            host.model.shm.gbps *= 2.0;
            for (what, f) in [
                ("network", net),
                ("nics", nics),
                ("latency", lat),
                ("host", host),
            ] {
                let t = step_time(&f, &w, None).unwrap().step_us;
                assert!(
                    t <= base * 1.0001,
                    "{name} overlap {overlap}: {what} {t} > {base}"
                );
            }
        }
    }
}

/// More ranks never move fewer bytes in all, for Auto's pick and for each
/// flat algorithm, on one host and across hosts.
#[test]
fn more_ranks_never_predict_less_traffic() {
    let c = resolve("2x8-eth100").unwrap().check().unwrap();
    for per_host in [1usize, 4] {
        let mut last: Vec<f64> = vec![0.0; 4];
        for hosts in [1usize, 2, 4, 8] {
            let ch = super::cluster::Checked {
                per_host,
                ..super::with_hosts(&c, hosts)
            };
            if ch.nranks() == 1 {
                continue;
            }
            let count = 1 << 18;
            let total = |s: tutti::tune::fabric::SimStats| s.net_bytes + s.host_bytes;
            let mut now = vec![total(
                price::auto(&ch, Collective::AllReduce, count, 4)
                    .unwrap()
                    .0
                    .stats,
            )];
            for alg in [Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling] {
                now.push(total(
                    price::price_one(&ch, Collective::AllReduce, count, 4, alg, 1).unwrap(),
                ));
            }
            for (i, (a, b)) in last.iter().zip(&now).enumerate() {
                assert!(b >= a, "{hosts}x{per_host}, series {i}: {b} bytes < {a}");
            }
            last = now;
        }
    }
}

/// The what-ifs: each is a real change, and faster hardware never loses.
#[test]
fn what_ifs_of_the_seeds_case() {
    let c = resolve("2x8-roce200").unwrap().check().unwrap();
    let w = resnet(120.0);
    let base = step_time(&c, &w, None).unwrap();
    let v = super::step::what_ifs(&c, &w, &base).unwrap();
    for x in &v {
        if x.what.starts_with("network") || x.what.contains("NICs") || x.what.contains("memory") {
            assert!(x.gain >= -1e-4, "{}: {}", x.what, x.gain);
        }
    }
    assert!(v.iter().any(|x| x.what == "bf16 on the wire"));
    assert!(v.windows(2).all(|p| p[0].gain >= p[1].gain));
}

/// A token bucket on the ports: read from the file, and never slower than
/// the same link without one; absent, the prediction is exactly today's.
#[test]
fn a_burst_never_slows_a_call() {
    let plain = Cluster::parse(GOOD).unwrap().check().unwrap();
    assert_eq!(plain.burst_bytes, 0.0);
    let shaped = GOOD.replace("ports = 2", "ports = 2\nburst_kib = 256\nline_gbit = 20");
    let b = Cluster::parse(&shaped).unwrap().check().unwrap();
    assert_eq!(b.burst_bytes, 256.0 * 1024.0);
    assert_eq!(b.model.tcp.gbps, 20.0 / 8.0);
    assert_eq!(b.fabric().burst_bytes, 256.0 * 1024.0);
    let zero = GOOD.replace("ports = 2", "ports = 2\nburst_kib = 0");
    let z = Cluster::parse(&zero).unwrap().check().unwrap();
    for alg in [Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree] {
        for count in [1usize << 10, 1 << 14, 1 << 16, 1 << 20] {
            let t = |c| {
                price::price_one(c, Collective::AllReduce, count, 4, alg, 1)
                    .unwrap()
                    .us
            };
            let (tp, tb, tz) = (t(&plain), t(&b), t(&z));
            assert_eq!(tp, tz, "{alg} {count}");
            assert!(tb <= tp * (1.0 + 1e-9), "{alg} {count}: {tb} > {tp}");
        }
    }
}
