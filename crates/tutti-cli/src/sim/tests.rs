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
        framework_us: 0.0,
        bucket_bytes: 25 << 20,
        overlap: true,
        sparsify: 1.0,
        accum: 1,
    }
}

/// A faster link (network or host, bandwidth or latency) never predicts a
/// slower step, on every preset with several hosts, overlapped or not,
/// with and without a framework cost, and where ranks share cores.
#[test]
fn a_faster_link_never_predicts_a_slower_step() {
    let shared = resolve("ns-1g").unwrap().check().unwrap().with_hosts(4);
    assert_eq!(shared.compute_slowdown(), 2.0);
    let presets = ["2x8-eth100", "2x8-roce200", "4x8-eth100", "ns-1g"];
    let clusters = presets
        .iter()
        .map(|n| (n.to_string(), resolve(n).unwrap().check().unwrap()))
        .chain([("ns-1g x 4".to_string(), shared)]);
    for (name, c) in clusters {
        for (overlap, framework_us) in [(true, 0.0), (false, 0.0), (true, 15e3), (false, 15e3)] {
            let w = Workload {
                overlap,
                framework_us,
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
                    "{name} overlap {overlap} framework {framework_us}: {what} {t} > {base}"
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

/// `tutti sim ... step` as the command line gives it.
fn step_args(extra: &[&str]) -> Result<super::step::StepArgs, String> {
    sim_args(extra).map(|a| a.step)
}

/// `tutti sim ns-1g step --grad-bytes 12763168 EXTRA...`, parsed.
fn sim_args(extra: &[&str]) -> Result<super::SimArgs, String> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        sim: super::SimArgs,
    }
    use clap::Parser;
    let argv = ["tutti", "ns-1g", "step", "--grad-bytes", "12763168"];
    Cli::try_parse_from(argv.iter().chain(extra))
        .map(|c| c.sim)
        .map_err(|e| e.to_string())
}

/// The report names both new terms: the framework's cost and the slowed
/// compute, with where each came from.
#[test]
fn the_step_report_shows_framework_and_slowdown() {
    let a = sim_args(&["--compute-ms", "31.47", "--step-1-ms", "46.9"]).unwrap();
    let c = resolve("ns-1g").unwrap().check().unwrap().with_hosts(4);
    let out = super::step::run(&a, &c).unwrap();
    assert!(
        out.contains("= compute 62.94 ms + framework 30.86 ms + exposed"),
        "{out}"
    );
    assert!(
        out.contains("compute: 31.47 ms per micro-batch x 2.00: 4 ranks share 2 cores"),
        "{out}"
    );
    assert!(
        out.contains("framework: 15.43 ms per step x 2.00 (--step-1-ms 46.90"),
        "{out}"
    );
    // One rank alone: the measured step.
    assert!(out.contains("       1       1       46.90"), "{out}");
    let plain = sim_args(&["--compute-ms", "31.47"]).unwrap();
    let out = super::step::run(&plain, &c.with_hosts(2)).unwrap();
    assert!(
        !out.contains("framework") && !out.contains("share 2 cores"),
        "{out}"
    );
}

/// `--step-1-ms`: parsed, the difference from the compute charged to every
/// step as its own term, and bad values named with what is allowed.
#[test]
fn step_1_ms_is_charged_as_the_frameworks_cost() {
    let a = step_args(&["--compute-ms", "31.47", "--step-1-ms", "46.9"]).unwrap();
    assert_eq!(a.step_1_ms, Some(46.9));
    let w = super::step::workload(&a).unwrap();
    assert!(
        (w.framework_us - 15_430.0).abs() < 1e-6,
        "{}",
        w.framework_us
    );
    let plain = super::step::workload(&step_args(&["--compute-ms", "31.47"]).unwrap()).unwrap();
    assert_eq!(plain.framework_us, 0.0);
    let c = resolve("ns-1g").unwrap().check().unwrap();
    let (t, t0) = (
        step_time(&c, &w, None).unwrap(),
        step_time(&c, &plain, None).unwrap(),
    );
    assert!((t.framework_us - 15_430.0).abs() < 1e-6);
    assert!((t.step_us - t0.step_us - 15_430.0).abs() < 1e-6);
    assert_eq!(t.exposed_us, t0.exposed_us);
    // One rank alone: the measured step itself, and efficiency against it.
    assert!((t.alone_us - 46_900.0).abs() < 1e-6);
    assert!((t.efficiency() - 46_900.0 / t.step_us).abs() < 1e-12);
    // With accumulation the step's compute is K micro-batches.
    let acc = step_args(&["--compute-ms", "10", "--accum", "2", "--step-1-ms", "25"]).unwrap();
    let acc = super::step::workload(&acc).unwrap();
    assert!((acc.framework_us - 5_000.0).abs() < 1e-6);
    // Below the compute (the two measurements' noise): no framework cost,
    // never a negative one; one rank alone is then its compute.
    for below in [
        &["--compute-ms", "31.47", "--step-1-ms", "30"][..],
        &["--compute-ms", "10", "--accum", "2", "--step-1-ms", "15"][..],
    ] {
        let w = super::step::workload(&step_args(below).unwrap()).unwrap();
        assert_eq!(w.framework_us, 0.0, "{below:?}");
        let t = step_time(&c, &w, None).unwrap();
        assert_eq!(t.alone_us, w.compute_us * w.accum as f64);
    }
    for (bad, why) in [
        (&["--compute-ms", "31.47", "--step-1-ms", "0"][..], "zero"),
        (&["--compute-ms", "31.47", "--step-1-ms=-1"][..], "negative"),
        (
            &["--compute-ms", "31.47", "--step-1-ms", "NaN"][..],
            "not a number",
        ),
        (
            &["--compute-ms", "31.47", "--step-1-ms", "inf"][..],
            "infinite",
        ),
    ] {
        let e = super::step::workload(&step_args(bad).unwrap()).expect_err(why);
        assert!(
            e.contains("--step-1-ms") && e.contains("allowed"),
            "{why}: {e}"
        );
    }
    let e = step_args(&["--compute-ms", "1", "--step-1-ms", "fast"]).expect_err("a word");
    assert!(e.contains("--step-1-ms"), "{e}");
}

/// `shared_cores`: more ranks than the machine's cores slow every rank's
/// compute (and framework cost) by ranks / cores, and rescale the model's
/// rates as the scaling table adds hosts; a cluster without it is unchanged.
#[test]
fn shared_cores_slow_the_compute_of_crowded_ranks() {
    let text = "hosts = 2\nranks_per_host = 1\nshared_cores = 2\n[host]\nbandwidth_gbit = 64\nlatency_us = 0.3\n[network]\nbandwidth_gbit = 1\nlatency_us = 60\n";
    let two = Cluster::parse(text).unwrap().check().unwrap();
    assert_eq!(
        (two.shared_cores, two.cpu_share, two.compute_slowdown()),
        (Some(2), 1.0, 1.0)
    );
    let four = two.with_hosts(4);
    assert_eq!((four.cpu_share, four.compute_slowdown()), (0.5, 2.0));
    assert_eq!(four.model.reduce_gbps, two.model.reduce_gbps * 0.5);
    // The same as the file checked with 4 hosts.
    let file4 = Cluster::parse(&text.replace("hosts = 2", "hosts = 4")).unwrap();
    assert_eq!(file4.check().unwrap(), four);
    assert_eq!(four.with_hosts(2), two);
    let w = Workload {
        framework_us: 10e3,
        ..resnet(30.0)
    };
    let (s2, s4) = (
        step_time(&two, &w, None).unwrap(),
        step_time(&four, &w, None).unwrap(),
    );
    assert_eq!((s2.compute_us, s2.framework_us), (30e3, 10e3));
    assert_eq!((s4.compute_us, s4.framework_us), (60e3, 20e3));
    assert_eq!((s2.alone_us, s4.alone_us), (40e3, 40e3));
    assert!(s4.step_us >= s4.compute_us + s4.framework_us);
    rejects(
        &text.replace("shared_cores = 2", "shared_cores = 0"),
        "shared_cores",
    );
    // Without shared_cores, host.cores or not, the compute is as given.
    for c in [
        resolve("2x8-eth100")
            .unwrap()
            .check()
            .unwrap()
            .with_hosts(4),
        Cluster::parse(&GOOD.replace("latency_us = 0.3", "latency_us = 0.3\ncores = 2"))
            .unwrap()
            .check()
            .unwrap(),
    ] {
        assert_eq!(c.compute_slowdown(), 1.0);
        let s = step_time(&c, &resnet(30.0), None).unwrap();
        assert_eq!(s.compute_us, 30e3);
        assert_eq!(s.efficiency(), s.compute_us / s.step_us);
    }
}

/// More hosts never move fewer bytes per step, where ranks share cores and
/// with a framework cost too; and never a faster step there.
#[test]
fn more_hosts_never_predict_less_step_traffic() {
    let c = resolve("ns-1g").unwrap().check().unwrap();
    let w = Workload {
        framework_us: 15e3,
        bucket_bytes: 1 << 20,
        ..resnet(30.0)
    };
    let w = Workload {
        params: 3_190_792,
        ..w
    };
    let mut last = (0.0, 0.0, 0.0);
    for hosts in [2usize, 4, 8] {
        let s = step_time(&c.with_hosts(hosts), &w, None).unwrap();
        assert!(
            s.net_bytes >= last.0 && s.all_bytes >= last.1,
            "{hosts} hosts: {s:?}"
        );
        assert!(s.step_us >= last.2, "{hosts} hosts: {s:?}");
        last = (s.net_bytes, s.all_bytes, s.step_us);
    }
}
