//! Signing once: the signatures a leader computed, offered to followers.
//!
//! Every node applies the same entries to the same state, so every node
//! builds the same record and, Ed25519 being deterministic, the same
//! signature; computing it was a sixth of a follower's CPU per write under
//! load (docs/benchmarks.md, "Signing on a follower"). The leader keeps
//! what it signed here; each AppendEntries carries the signatures a
//! follower has not been sent yet and the log index the leader has applied
//! up to. A follower takes an offered signature only when the bytes it is
//! about to sign have the digest the leader signed, so a divergence can
//! never attach a signature to other bytes: it signs those itself.
//!
//! A follower about to apply entries its leader has not applied yet waits
//! for the leader's next message (under load about one round trip), at most
//! [`WAIT`]; it never waits for a leader that offers nothing (an older
//! release, or another leader than the entries' proposer).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::keys::Signer;

/// Longest a follower holds back an apply for its leader's signatures.
pub const WAIT: Duration = Duration::from_millis(50);

/// Signatures kept for offering, and offers kept for taking; older ones go
/// first (a follower that far behind signs for itself).
const KEPT: usize = 16_384;

/// Offers one AppendEntries carries at most.
pub const MAX_OFFERS: usize = 4_096;

/// One signature as offered: the record's revision, the SHA-256 of the
/// bytes signed, and the signature value as stored in the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub revision: u64,
    pub digest: [u8; 32],
    pub value: String,
}

/// A leader as entries name their proposer: (term, node id).
pub type Proposer = (u64, u64);

#[derive(Default)]
struct Inner {
    /// Signatures this node computed, by revision.
    made: BTreeMap<u64, ([u8; 32], String)>,
    /// Signatures a leader offered this node, by revision.
    offered: BTreeMap<u64, ([u8; 32], String)>,
    /// The leader that offered last, and the log index it had applied.
    leader: Option<(Proposer, u64)>,
    /// The log index this node has applied up to, and the revision.
    applied: u64,
    applied_revision: u64,
}

/// Shared by a node's state machine (which signs and takes) and its Raft
/// transport (which sends and receives offers).
#[derive(Default)]
pub struct SignatureBook {
    inner: Mutex<Inner>,
    offered: tokio::sync::Notify,
    /// Signatures computed here, and offers taken instead.
    signed: AtomicU64,
    taken: AtomicU64,
}

/// An Ed25519 signature as records carry it: 64 bytes, base64url without
/// padding. Anything else offered is a leader's bug, not a signature.
fn looks_like_a_signature(value: &str) -> bool {
    value.len() == 86
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn trim(map: &mut BTreeMap<u64, ([u8; 32], String)>) {
    while map.len() > KEPT {
        map.pop_first();
    }
}

impl SignatureBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The signature of `bytes` for the record at `revision`: the one a
    /// leader offered for exactly these bytes, else computed here (and kept
    /// to offer, should this node lead).
    pub fn sign(&self, signer: &Signer, revision: u64, bytes: &[u8]) -> String {
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        let mut inner = self.lock();
        if let Some((offered, value)) = inner.offered.remove(&revision) {
            if offered == digest {
                self.taken.fetch_add(1, Ordering::Relaxed);
                return value;
            }
            tracing::warn!(
                revision,
                "the leader's signature covers other bytes than this node's record; signing here"
            );
        }
        drop(inner);
        let value = signer.sign(bytes);
        self.signed.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.lock();
        inner.made.insert(revision, (digest, value.clone()));
        trim(&mut inner.made);
        value
    }

    /// This node applied entries up to `index`, the last at `revision`:
    /// offers up to it are no longer needed.
    pub fn applied(&self, index: u64, revision: u64) {
        let mut inner = self.lock();
        inner.applied = inner.applied.max(index);
        inner.applied_revision = inner.applied_revision.max(revision);
        inner.offered = inner.offered.split_off(&(revision + 1));
    }

    /// The newest revision signed here (where a new connection's offers
    /// start: a follower further behind signs for itself).
    pub fn newest(&self) -> u64 {
        self.lock().made.last_key_value().map_or(0, |(r, _)| *r)
    }

    /// Leader: the signatures made after revision `after` (at most
    /// [`MAX_OFFERS`], oldest first) and the log index applied up to.
    pub fn offers_after(&self, after: u64) -> (Vec<Offer>, u64) {
        let inner = self.lock();
        let offers = inner
            .made
            .range(after + 1..)
            .take(MAX_OFFERS)
            .map(|(revision, (digest, value))| Offer {
                revision: *revision,
                digest: *digest,
                value: value.clone(),
            })
            .collect();
        (offers, inner.applied)
    }

    /// Follower: `leader` offers `offers` and has applied up to
    /// `leader_applied` (0: a leader that offers nothing).
    pub fn receive(&self, leader: Proposer, leader_applied: u64, offers: Vec<Offer>) {
        if leader_applied == 0 && offers.is_empty() {
            return;
        }
        let mut inner = self.lock();
        for o in offers {
            if o.revision > inner.applied_revision && looks_like_a_signature(&o.value) {
                inner.offered.insert(o.revision, (o.digest, o.value));
            }
        }
        trim(&mut inner.offered);
        inner.leader = Some((leader, leader_applied));
        drop(inner);
        self.offered.notify_waiters();
    }

    /// An election is under way (this node asks for votes, or is asked):
    /// the leader that offered last may be gone, so nothing waits for it
    /// until a leader offers again. Without this, a new leader applying its
    /// predecessor's last entries would wait out the bound.
    pub fn forget_leader(&self) {
        self.lock().leader = None;
        self.offered.notify_waiters();
    }

    /// Follower: waits (at most `bound`) until `proposer`, the leader whose
    /// entries up to `index` are about to be applied, has applied them
    /// itself and so offered their signatures. Returns at once when the
    /// last offers came from another leader, or from none.
    pub async fn wait_for(&self, proposer: Proposer, index: u64, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let notified = self.offered.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.lock().leader {
                Some((leader, applied)) if leader == proposer && applied < index => {}
                _ => return,
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }

    /// Signatures computed here, and offers taken instead, since start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.signed.load(Ordering::Relaxed),
            self.taken.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::NewKey;
    use crate::crypto::{Identity, IdentityChange};

    fn signer() -> Signer {
        Identity::apply(
            None,
            &IdentityChange::Establish {
                authority: "a.example".into(),
                keys: vec![NewKey::generate().unwrap()],
                imported: false,
            },
            "2026-01-01T00:00:00Z",
        )
        .unwrap()
        .0
        .unwrap()
        .signer()
        .unwrap()
    }

    /// What a leader's book offers a follower's, as AppendEntries carries it.
    fn pass_on(leader: &SignatureBook, follower: &SignatureBook, after: u64) {
        let (offers, applied) = leader.offers_after(after);
        follower.receive((2, 1), applied, offers);
    }

    #[test]
    fn a_follower_takes_the_leaders_signature_of_the_same_bytes_only() {
        let s = signer();
        let (leader, follower) = (SignatureBook::default(), SignatureBook::default());
        let a = leader.sign(&s, 5, b"record five");
        let b = leader.sign(&s, 6, b"record six");
        leader.applied(3, 6);
        pass_on(&leader, &follower, 0);
        // Same bytes: the leader's signature, not computed again.
        assert_eq!(follower.sign(&s, 5, b"record five"), a);
        assert_eq!(follower.counts(), (0, 1));
        // Other bytes at the same revision (a divergence): signed here,
        // and the signature is of these bytes.
        let own = follower.sign(&s, 6, b"record six, changed");
        assert_ne!(own, b);
        assert_eq!(own, s.sign(b"record six, changed"));
        assert_eq!(follower.counts(), (1, 1));
        // Nothing offered: signed here.
        assert_eq!(follower.sign(&s, 7, b"seven"), s.sign(b"seven"));
        assert_eq!(follower.counts(), (2, 1));
        // An offer that is no signature is not kept, digest or not.
        let digest: [u8; 32] = Sha256::digest(b"eight").into();
        let garbage = Offer {
            revision: 8,
            digest,
            value: "not a signature".into(),
        };
        follower.receive((2, 1), 8, vec![garbage]);
        assert_eq!(follower.sign(&s, 8, b"eight"), s.sign(b"eight"));
        assert_eq!(follower.counts(), (3, 1));
    }

    #[test]
    fn offers_start_after_what_was_sent_and_stale_ones_are_dropped() {
        let s = signer();
        let (leader, follower) = (SignatureBook::default(), SignatureBook::default());
        for r in 1..=4 {
            leader.sign(&s, r, format!("r{r}").as_bytes());
        }
        leader.applied(4, 4);
        let (offers, applied) = leader.offers_after(2);
        assert_eq!(
            offers.iter().map(|o| o.revision).collect::<Vec<_>>(),
            [3, 4]
        );
        assert_eq!(applied, 4);
        assert_eq!(leader.newest(), 4);
        // A follower that has applied revision 3 keeps only the offer for 4.
        follower.applied(3, 3);
        follower.receive((2, 1), applied, offers);
        assert_eq!(follower.sign(&s, 3, b"r3"), s.sign(b"r3"));
        assert_eq!(follower.counts(), (1, 0));
        follower.sign(&s, 4, b"r4");
        assert_eq!(follower.counts(), (1, 1));
    }

    #[tokio::test]
    async fn a_follower_waits_for_its_leader_only_and_never_long() {
        let book = std::sync::Arc::new(SignatureBook::default());
        let bound = Duration::from_millis(200);
        // No leader has offered anything (an older leader): no wait.
        let started = tokio::time::Instant::now();
        book.wait_for((2, 1), 10, bound).await;
        assert!(started.elapsed() < Duration::from_millis(50));
        // The leader has applied up to 4; entries up to 10 wait for it,
        // and go on as soon as it says it applied them.
        book.receive((2, 1), 4, Vec::new());
        let waiting = {
            let book = book.clone();
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                book.wait_for((2, 1), 10, Duration::from_secs(10)).await;
                started.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        book.receive((2, 1), 9, Vec::new());
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished(), "9 of 10 applied is not enough");
        book.receive((2, 1), 10, Vec::new());
        let waited = waiting.await.unwrap();
        assert!(waited >= Duration::from_millis(60) && waited < Duration::from_secs(5));
        // An election: nothing waits for the leader that offered last.
        book.receive((2, 1), 4, Vec::new());
        let waiting = {
            let book = book.clone();
            tokio::spawn(async move { book.wait_for((2, 1), 10, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished());
        book.forget_leader();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("released by the election")
            .unwrap();
        book.receive((2, 1), 10, Vec::new());
        // Entries another leader proposed do not wait for this one.
        let started = tokio::time::Instant::now();
        book.wait_for((3, 2), 20, bound).await;
        assert!(started.elapsed() < Duration::from_millis(50));
        // A leader that went quiet holds an apply back no longer than the
        // bound.
        let started = tokio::time::Instant::now();
        book.wait_for((2, 1), 20, bound).await;
        let waited = started.elapsed();
        assert!(waited >= bound && waited < bound * 5, "{waited:?}");
    }
}
