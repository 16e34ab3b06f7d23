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
