use super::*;
use crate::arrivals::{Ramp, RampAxis};
use crate::drive::ramp;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn parse(extra: &[&str]) -> Result<BenchArgs, clap::Error> {
    let mut argv = vec!["bench", "--url", "http://x"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).map(|c| c.bench)
}

#[test]
fn validation_rejects_unrunnable_flags() {
    for bad in [
        &["--rate", "0"][..],
        &["--rate", "inf", "--duration", "5"],
        &["--burstiness", "0"],
        &["--ramp-up-start-rps", "0", "--ramp-up-end-rps", "5"],
        &["--capacity-attainment", "1.5"],
        &["--num-requests", "0"],
    ] {
        let args = parse(bad).unwrap();
        assert!(
            matches!(validate(&args), Err(BenchError::Config(_))),
            "{bad:?}"
        );
    }
    assert!(validate(&parse(&["--rate", "inf", "--num-requests", "5"]).unwrap()).is_ok());
    assert!(
        parse(&["--rate", "5", "--sweep", "1:2:1"]).is_err(),
        "rate and sweep conflict"
    );
    assert!(
        parse(&["--ramp-up-start-rps", "1"]).is_err(),
        "ramp needs both ends"
    );
}

#[test]
fn vllm_aliases_parse() {
    let a = parse(&["--request-rate", "3", "--num-prompts", "7"]).unwrap();
    assert_eq!((a.rate, a.num_requests), (3.0, Some(7)));
    assert_eq!(limits(&parse(&[]).unwrap()).num_requests, Some(1000));
    let ramp = ramp(
        &parse(&["--ramp-up-start-rps", "1", "--ramp-up-end-rps", "9"]).unwrap(),
        &Limits {
            duration_s: None,
            num_requests: Some(100),
        },
    );
    assert_eq!(
        ramp,
        Ramp::Linear {
            start: 1.0,
            end: 9.0,
            over: 100.0,
            axis: RampAxis::Requests
        }
    );
}
