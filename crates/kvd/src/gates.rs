//! etcd's `--feature-gates` (3.7's): `Name=bool` pairs by etcd's names, with etcd's errors for
//! an unknown gate or a bad value. A gate kvd implements takes either value; one it does not is
//! refused when turned on, with the reason.

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
        support: Support::Yes,
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
    /// Renew a lease the leader has without waiting for the applied index (etcd 3.7's
    /// FastLeaseKeepAlive, on by default).
    pub fast_lease_keep_alive: bool,
}

/// Go's `strconv.ParseBool`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses `--feature-gates` (`spec`).
pub fn parse(spec: &str) -> Result<Gates, String> {
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
    Ok(Gates {
        initial_corrupt_check: value(gate("InitialCorruptCheck"))
            .unwrap_or(gate("InitialCorruptCheck").default),
        // kvd's own default: checkpoints on (a leader change otherwise restarts every lease
        // from its full TTL).
        lease_checkpoint: value(gate("LeaseCheckpoint")).unwrap_or(true),
        priority_request: value(gate("PriorityRequest")).unwrap_or(gate("PriorityRequest").default),
        fast_lease_keep_alive: value(gate("FastLeaseKeepAlive"))
            .unwrap_or(gate("FastLeaseKeepAlive").default),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(spec: &str) -> Result<Gates, String> {
        parse(spec)
    }

    #[test]
    fn defaults_and_implemented_gates() {
        let d = gates("").unwrap();
        assert!(!d.initial_corrupt_check && d.lease_checkpoint && !d.priority_request);
        assert!(d.fast_lease_keep_alive, "on by default, as in etcd 3.7");
        assert!(gates("PriorityRequest=true").unwrap().priority_request);
        assert!(
            !gates("FastLeaseKeepAlive=false")
                .unwrap()
                .fast_lease_keep_alive
        );
        // AllBeta=false turns the beta gates off.
        assert!(!gates("AllBeta=false").unwrap().fast_lease_keep_alive);
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
        ] {
            let err = gates(spec).unwrap_err();
            assert!(err.contains(want), "{spec}: {err}");
        }
    }
}
