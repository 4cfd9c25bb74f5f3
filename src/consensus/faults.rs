//! Network fault rules for testing a cluster under drops, delays and
//! partitions. They are only ever set when the operator turned on
//! `fault_injection` (tests do); otherwise the table stays empty and costs one
//! uncontended read lock per message.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::NodeId;

/// How traffic with one peer is disturbed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkFault {
    /// No traffic in either direction.
    pub blocked: bool,
    /// Probability that an outgoing message is lost.
    pub drop_rate: f64,
    /// Added before every outgoing message.
    pub delay: Duration,
}

/// What to do with one message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    Deliver { delay: Duration },
    Drop,
}

/// The fault table of a node, shared by its client and server sides.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    rules: Arc<RwLock<HashMap<NodeId, LinkFault>>>,
}

impl Faults {
    /// Replaces all rules; an empty list heals the node.
    pub fn set(&self, rules: impl IntoIterator<Item = (NodeId, LinkFault)>) {
        let mut table = self.rules.write().unwrap_or_else(|p| p.into_inner());
        table.clear();
        table.extend(rules);
    }

    fn rule(&self, peer: NodeId) -> Option<LinkFault> {
        let table = self.rules.read().unwrap_or_else(|p| p.into_inner());
        table.get(&peer).copied()
    }

    /// Decides the fate of a message this node sends to `peer`.
    pub fn outgoing(&self, peer: NodeId) -> Verdict {
        let Some(rule) = self.rule(peer) else {
            return Verdict::Deliver {
                delay: Duration::ZERO,
            };
        };
        if rule.blocked || (rule.drop_rate > 0.0 && coin() < rule.drop_rate) {
            return Verdict::Drop;
        }
        Verdict::Deliver { delay: rule.delay }
    }

    /// Whether a message from `peer` is refused (partitions cut both ways
    /// even when only one side was told about them).
    pub fn refuses(&self, peer: NodeId) -> bool {
        self.rule(peer).is_some_and(|r| r.blocked)
    }
}

/// A uniform number in [0, 1).
fn coin() -> f64 {
    let bits = getrandom::u64().unwrap_or(0);
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_block_drop_delay_and_heal() {
        let f = Faults::default();
        assert_eq!(
            f.outgoing(2),
            Verdict::Deliver {
                delay: Duration::ZERO
            }
        );
        f.set([
            (
                2,
                LinkFault {
                    blocked: true,
                    ..Default::default()
                },
            ),
            (
                3,
                LinkFault {
                    drop_rate: 1.0,
                    ..Default::default()
                },
            ),
            (
                4,
                LinkFault {
                    delay: Duration::from_millis(7),
                    ..Default::default()
                },
            ),
        ]);
        assert_eq!(f.outgoing(2), Verdict::Drop);
        assert!(f.refuses(2));
        assert_eq!(f.outgoing(3), Verdict::Drop);
        assert!(!f.refuses(3));
        assert_eq!(
            f.outgoing(4),
            Verdict::Deliver {
                delay: Duration::from_millis(7)
            }
        );
        f.set([]);
        assert!(!f.refuses(2));
        assert_eq!(
            f.outgoing(3),
            Verdict::Deliver {
                delay: Duration::ZERO
            }
        );
    }
}
