//! etcd's `--feature-gates` (3.6's and 3.7's): `Name=bool` pairs by etcd's names, with etcd's errors for an
//! unknown gate or a bad value. A gate kvd implements takes either value; one it does not is
//! refused when turned on, with the reason; the deprecated `--experimental-*` flag that sets the
//! same thing may not be given beside its gate (etcd's "cannot specify both flags").

/// How kvd honours a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Support {
    /// Implemented: either value.
    Yes,
    /// Either value accepted, with no effect: kvd behaves one way always (why).
    Moot(&'static str),
    /// Not implemented: turning it on is refused (why).
    No(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Alpha,
    Beta,
}

struct Gate {
    name: &'static str,
    stage: Stage,
    /// etcd's default.
    default: bool,
    support: Support,
}

/// etcd 3.7.1's gates (`etcd --help`), but AllAlpha and AllBeta, which set the defaults of the
/// others of their stage.
const GATES: &[Gate] = &[
    Gate {
        name: "CompactHashCheck",
        stage: Stage::Alpha,
        default: false,
        support: Support::No(
            "kvd keeps no hashes of past compactions; --corrupt-check-time compares members' hashes",
        ),
    },
    Gate {
        name: "FastLeaseKeepAlive",
        stage: Stage::Beta,
        default: true,
        support: Support::No(
            "kvd renews a lease once a quorum confirms its leader and the applied index catches up (etcd's way with the gate off)",
        ),
    },
    Gate {
        name: "InitialCorruptCheck",
        stage: Stage::Alpha,
        default: false,
        support: Support::Yes,
    },
    Gate {
        name: "LeaseCheckpoint",
        stage: Stage::Alpha,
        default: false,
        support: Support::Yes,
    },
    Gate {
        name: "LeaseCheckpointPersist",
        stage: Stage::Alpha,
        default: false,
        support: Support::Moot("kvd always stores a checkpointed lease's remaining TTL"),
    },
    Gate {
        name: "PriorityRequest",
        stage: Stage::Alpha,
        default: false,
        support: Support::Yes,
    },
    Gate {
        name: "SetMemberLocalAddr",
        stage: Stage::Alpha,
        default: false,
        support: Support::No("kvd dials its peers from the address the system chooses"),
    },
    Gate {
        name: "StopGRPCServiceOnDefrag",
        stage: Stage::Alpha,
        default: false,
        support: Support::No("kvd serves reads and writes while it defragments"),
    },
    Gate {
        name: "TxnModeWriteWithSharedBuffer",
        stage: Stage::Beta,
        default: true,
        support: Support::Moot("a bbolt read-buffer detail; kvd's write transactions always read their own writes"),
    },
];

/// The gates in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gates {
    /// Compare this member's hash with its peers' before it serves (a restart only).
    pub initial_corrupt_check: bool,
    /// Checkpoint leases' remaining TTLs (kvd's default: on).
    pub lease_checkpoint: bool,
    /// Let a LeaseRevoke through while the applied index lags the commit index by up to twice
    /// what other requests may (etcd 3.7's PriorityRequest), so expired leases go in time.
    pub priority_request: bool,
}

/// The deprecated flags a gate replaces, as given (None: not given).
#[derive(Debug, Clone, Copy, Default)]
pub struct Deprecated {
    /// `--experimental-initial-corrupt-check`.
    pub initial_corrupt_check: Option<bool>,
    /// `--experimental-enable-lease-checkpoint`.
    pub lease_checkpoint: Option<bool>,
}

/// Go's `strconv.ParseBool`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses `--feature-gates` (`spec`) with the deprecated flags beside it.
pub fn parse(spec: &str, old: Deprecated) -> Result<Gates, String> {
    let bad = |why: String| format!("invalid value {spec:?} for flag --feature-gates: {why}");
    let mut set: Vec<(&str, bool)> = Vec::new();
    let (mut all_alpha, mut all_beta) = (None, None);
    for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(bad(format!("missing bool value for {pair}")));
        };
        let (name, value) = (name.trim(), value.trim());
        let v = parse_bool(value).ok_or_else(|| {
            bad(format!(
                "invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"
            ))
        })?;
        match name {
            "AllAlpha" => all_alpha = Some(v),
            "AllBeta" => all_beta = Some(v),
            _ if GATES.iter().any(|g| g.name == name) => {
                set.retain(|(n, _)| *n != name);
                set.push((name, v));
            }
            _ => return Err(bad(format!("unrecognized feature gate: {name}"))),
        }
    }
    let value = |g: &Gate| -> Option<bool> {
        set.iter()
            .find(|(n, _)| *n == g.name)
            .map(|&(_, v)| v)
            .or(match g.stage {
                Stage::Alpha => all_alpha,
                Stage::Beta => all_beta,
            })
    };
    for g in GATES {
        if let (Support::No(why), Some(true)) = (g.support, value(g)) {
            return Err(format!(
                "--feature-gates: {}=true is not supported: {why}",
                g.name
            ));
        }
    }
    let gate = |name: &str| {
        GATES
            .iter()
            .find(|g| g.name == name)
            .expect("a listed gate")
    };
    let both = |gate_name: &str, flag: &str, old: Option<bool>| -> Result<Option<bool>, String> {
        let given = value(gate(gate_name));
        match (old, given) {
            (Some(o), Some(g)) => Err(format!(
                "cannot specify both flags: --{flag}={o} and --feature-gates={gate_name}={g} at the same time, please just use --feature-gates={gate_name}={g}"
            )),
            (o, g) => Ok(g.or(o)),
        }
    };
    let initial = both(
        "InitialCorruptCheck",
        "experimental-initial-corrupt-check",
        old.initial_corrupt_check,
    )?;
    let checkpoint = both(
        "LeaseCheckpoint",
        "experimental-enable-lease-checkpoint",
        old.lease_checkpoint,
    )?;
    Ok(Gates {
        initial_corrupt_check: initial.unwrap_or(gate("InitialCorruptCheck").default),
        // kvd's own default: checkpoints on (a leader change otherwise restarts every lease
        // from its full TTL).
        lease_checkpoint: checkpoint.unwrap_or(true),
        priority_request: value(gate("PriorityRequest")).unwrap_or(gate("PriorityRequest").default),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(spec: &str) -> Result<Gates, String> {
        parse(spec, Deprecated::default())
    }

    #[test]
    fn defaults_and_implemented_gates() {
        let d = gates("").unwrap();
        assert!(!d.initial_corrupt_check && d.lease_checkpoint && !d.priority_request);
        assert!(gates("PriorityRequest=true").unwrap().priority_request);
        let g = gates("InitialCorruptCheck=true, LeaseCheckpoint=false").unwrap();
        assert!(g.initial_corrupt_check && !g.lease_checkpoint);
        // The last of a gate given twice wins, as in etcd.
        assert!(
            !gates("InitialCorruptCheck=true,InitialCorruptCheck=0")
                .unwrap()
                .initial_corrupt_check
        );
        // Gates kvd behaves one way for take either value.
        gates("LeaseCheckpointPersist=false,TxnModeWriteWithSharedBuffer=false").unwrap();
        // AllAlpha turns on every alpha gate not given: the ones kvd lacks must be turned off.
        let err = gates("AllAlpha=true").unwrap_err();
        assert!(
            err.contains("CompactHashCheck=true is not supported"),
            "{err}"
        );
        let all = gates(
            "AllAlpha=true,CompactHashCheck=false,SetMemberLocalAddr=false,StopGRPCServiceOnDefrag=false",
        )
        .unwrap();
        assert!(all.initial_corrupt_check && all.lease_checkpoint && all.priority_request);
    }

    #[test]
    fn etcds_errors() {
        for (spec, want) in [
            ("Foo=true", "unrecognized feature gate: Foo"),
            ("InitialCorruptCheck", "missing bool value for InitialCorruptCheck"),
            (
                "InitialCorruptCheck=maybe",
                "invalid value of InitialCorruptCheck=maybe, err: strconv.ParseBool: parsing \"maybe\": invalid syntax",
            ),
            ("StopGRPCServiceOnDefrag=true", "kvd serves reads and writes while it defragments"),
            ("FastLeaseKeepAlive=true", "FastLeaseKeepAlive=true is not supported"),
        ] {
            let err = gates(spec).unwrap_err();
            assert!(err.contains(want), "{spec}: {err}");
        }
    }

    #[test]
    fn a_deprecated_flag_beside_its_gate() {
        let old = Deprecated {
            initial_corrupt_check: Some(false),
            lease_checkpoint: Some(false),
        };
        let err = parse("InitialCorruptCheck=true", old).unwrap_err();
        assert_eq!(
            err,
            "cannot specify both flags: --experimental-initial-corrupt-check=false and --feature-gates=InitialCorruptCheck=true at the same time, please just use --feature-gates=InitialCorruptCheck=true"
        );
        // Alone, the deprecated flags still work.
        let g = parse("", old).unwrap();
        assert!(!g.initial_corrupt_check && !g.lease_checkpoint);
        let on = Deprecated {
            initial_corrupt_check: Some(true),
            ..old
        };
        assert!(parse("", on).unwrap().initial_corrupt_check);
    }
}
