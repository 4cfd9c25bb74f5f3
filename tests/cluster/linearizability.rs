//! Linearizability checking for histories recorded against a live cluster.
//!
//! The cluster tests drive several clients at once, record for every request
//! when it was sent, whether and when it was answered and what the answer was,
//! and then ask whether one sequential execution of a [`Model`] explains all
//! of it, with every operation taking effect somewhere between its call and
//! its return. That catches what per-request assertions cannot: a stale read
//! served by a deposed leader, an acknowledged write that was lost, two
//! clients seeing concurrent writes in different orders.
//!
//! # Algorithm
//!
//! This is the Wing & Gong search with Lowe's memoisation (Gavin Lowe,
//! "Testing for Linearizability", 2017; the approach porcupine takes). Calls
//! and returns are merged into one time-ordered list. At any point of the
//! search, the operations that may take effect next are exactly those whose
//! call comes before the first return still in the list: anything called
//! later would be ordered after an operation that had already returned before
//! it started. The search picks one, applies it to the model, removes its call
//! and return from the list (a dancing-links splice, undone on backtrack) and
//! carries on; when none of the candidates fits, the operation owning that
//! first return has run out of time and the search backtracks.
//!
//! Plain Wing & Gong is exponential in the number of concurrent operations.
//! Lowe's observation is that two search nodes with the same set of linearized
//! operations and equal model states have the same future, so a (set, state)
//! pair found to be a dead end never needs exploring again. With that cache
//! the work is roughly the history's length times the number of orderings of
//! each window of concurrent operations that the model accepts, which for a
//! key-value store observed by a handful of clients is small. Candidates that
//! leave the state unchanged (typically reads that match) are tried first,
//! then those whose deadline is nearest, which makes backtracking rarer
//! without affecting the result.
//!
//! The search keeps its own stack instead of recursing, because a
//! linearization of a long history is as deep as the history is long.
//!
//! # Indeterminate operations
//!
//! A request that timed out, or whose connection broke, may never have reached
//! the leader, or may still be sitting in the Raft log and be applied long
//! after the client gave up. Its give-up time is therefore no deadline: an
//! operation with `output == None` gets no return entry at all, whatever
//! `ret` says. It may take effect at any point after its call (with whatever
//! result the model allows) or not at all, and the search succeeds as soon as
//! every *completed* operation has been linearized, leaving the remaining
//! indeterminate ones out.
//!
//! Treated as ordinary candidates, such operations wreck the search: each
//! pending one could be slotted in at every point the search backtracks
//! through, in every order with the others. So the search moves from one
//! completed operation to the next, and between two of them considers runs of
//! indeterminate operations only after trying none at all, and then
//! breadth-first, keeping for each state a run reaches only the smallest sets
//! of operations that reach it. The cache likewise treats a node as a dead end
//! if a known dead end has the same completed operations, the same state and a
//! subset of its indeterminate ones: whatever could follow the node could
//! follow the dead end too, by leaving the extra operations out. Pending
//! indeterminate operations with equal inputs (judged by their `Debug`
//! output) are interchangeable, so runs use them in call order only; ten lost
//! deletes are then one choice rather than ten.
//!
//! An operation with an output but `ret == None` (an answer whose arrival time
//! was not recorded) must take effect, with that output, at some point after
//! its call.
//!
//! # Timestamps
//!
//! A call and a return with the same timestamp count as concurrent: the
//! checker only orders `a` before `b` when `a` returned strictly before `b`
//! was called. Timestamps only need to be monotonic across all clients, e.g.
//! nanoseconds since one `Instant` taken when the test started.
//!
//! # Cost
//!
//! Linearized sets are bitsets; the cache stores them trimmed to the window
//! between the oldest completed operation not yet linearized and the newest
//! one that is (plus one bit per indeterminate operation), so memory grows
//! with the number of search nodes rather than with that times the history's
//! length.
//!
//! Indeterminate operations are what make a check expensive. A lost write
//! that nobody observed stays a candidate until the end of the history, and
//! every point the search backtracks through pays for each pending one, so
//! the cost grows faster than the length of a key's history times its
//! number of lost requests: keep per-key histories to a few thousand
//! operations (more keys, not more operations per key) when many requests
//! time out. Proving that a history with many of them is *not* linearizable
//! means ruling out every subset of them at every point, which can be
//! exponential: expect `Unknown` there rather than an explanation, and
//! choose `max_steps` accordingly.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Debug};
use std::hash::{Hash, Hasher};
use std::rc::Rc;

/// The sequential specification the history is checked against.
///
/// `Eq` and `Hash` are needed because the search remembers which
/// (linearized set, state) pairs it has already explored; two states that
/// compare equal must behave identically from then on.
pub trait Model: Clone + Eq + Hash {
    type Input: Clone + Debug;
    type Output: Clone + Debug;

    /// The state after applying `input` in `self`, if doing so can produce
    /// `output`; `None` if it cannot.
    ///
    /// `output == None` means the outcome is unknown (the request timed out or
    /// its connection broke): return the state the operation would leave if
    /// it did take effect, whatever its result, or `None` if it cannot take
    /// effect in this state at all. The checker itself covers the case where
    /// it never took effect, so `step` must not try to.
    ///
    /// Must be a pure function of its arguments: the search replays and
    /// memoises steps, and relies on equal states stepping alike. Inputs
    /// whose `Debug` output is the same must also step alike (true of derived
    /// `Debug`): indeterminate operations with such inputs are treated as
    /// interchangeable.
    fn step(&self, input: &Self::Input, output: Option<&Self::Output>) -> Option<Self>;
}

/// One request as a client observed it.
///
/// `call` and `ret` are timestamps from one monotonic clock shared by all
/// clients. An operation is indeterminate when `output` is `None`; its `ret`
/// is then ignored, since the request may still take effect after the client
/// stopped waiting (record `ret: None` for such operations).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation<I, O> {
    /// Which client issued it; only used in explanations.
    pub client: usize,
    pub call: u64,
    pub ret: Option<u64>,
    pub input: I,
    pub output: Option<O>,
}

/// The outcome of a check.
///
/// `Display` prints the explanation with its line breaks, which `Debug`
/// would escape; use it in assertion messages.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// Refers to operations by their index in the slice passed to [`check`]
    /// or [`check_partitioned`]; a malformed history (an operation returning
    /// before its call) is also reported this way.
    NotLinearizable {
        explanation: String,
    },
    /// The search gave up after `steps` model steps without an answer.
    Unknown {
        steps: u64,
    },
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Linearizable => f.write_str("linearizable"),
            Verdict::NotLinearizable { explanation } => {
                write!(f, "not linearizable: {explanation}")
            }
            Verdict::Unknown { steps } => {
                write!(f, "unknown: the search gave up after {steps} steps")
            }
        }
    }
}

/// Checks one history against one model.
///
/// `max_steps` bounds the number of [`Model::step`] calls; use `u64::MAX` for
/// no bound. A failure found within the bound is reported even when other
/// parts of the search were not finished, since it is a proof on its own.
pub fn check<M: Model>(
    init: M,
    history: &[Operation<M::Input, M::Output>],
    max_steps: u64,
) -> Verdict {
    let ops: Vec<(usize, &Op<M>)> = history.iter().enumerate().collect();
    check_labelled(init, ops, max_steps)
}

/// Checks a history of operations on independent keys, one key at a time.
///
/// Linearizability is compositional: a history is linearizable exactly when
/// its restriction to every object is, so checking keys separately loses
/// nothing and turns one search over the product of all keys' states into
/// many small ones. `init` gives each key's initial state.
///
/// `max_steps` applies to each key separately. Keys are checked in `Ord`
/// order; the first one that is not linearizable is named in the explanation,
/// whose operation indices refer to positions in `history`. If no key fails
/// but some ran out of steps, the result is `Unknown` with the steps spent on
/// those keys.
// The signature spells the operation type out so callers need no alias.
#[allow(clippy::type_complexity)]
pub fn check_partitioned<K: Ord + Clone + Debug, M: Model>(
    init: impl Fn(&K) -> M,
    history: &[(K, Operation<M::Input, M::Output>)],
    max_steps: u64,
) -> Verdict {
    let mut by_key: BTreeMap<&K, Vec<(usize, &Op<M>)>> = BTreeMap::new();
    for (index, (key, op)) in history.iter().enumerate() {
        by_key.entry(key).or_default().push((index, op));
    }
    let mut unknown_steps: Option<u64> = None;
    for (key, ops) in by_key {
        match check_labelled(init(key), ops, max_steps) {
            Verdict::Linearizable => {}
            Verdict::NotLinearizable { explanation } => {
                return Verdict::NotLinearizable {
                    explanation: format!("key {key:?}: {explanation}"),
                };
            }
            Verdict::Unknown { steps } => {
                unknown_steps = Some(unknown_steps.unwrap_or(0).saturating_add(steps));
            }
        }
    }
    match unknown_steps {
        Some(steps) => Verdict::Unknown { steps },
        None => Verdict::Linearizable,
    }
}

type Op<M> = Operation<<M as Model>::Input, <M as Model>::Output>;

/// End of a linked list, and "no return entry".
const NIL: usize = usize::MAX;
/// How much of the longest prefix an explanation shows.
const PREFIX_SHOWN: usize = 32;
/// How many blocked candidates an explanation lists.
const CANDIDATES_SHOWN: usize = 32;

/// Runs the search over operations labelled with the indices the caller
/// knows them by.
fn check_labelled<M: Model>(init: M, mut ops: Vec<(usize, &Op<M>)>, max_steps: u64) -> Verdict {
    for &(label, op) in &ops {
        if let (Some(ret), Some(_)) = (op.ret, &op.output) {
            if ret < op.call {
                let explanation = format!(
                    "malformed history: operation {} returns before it is called",
                    describe(label, op)
                );
                return Verdict::NotLinearizable { explanation };
            }
        }
    }
    // Completed operations first, each group by call time: this makes the
    // linearized set a prefix plus a narrow window in index order, which is
    // what lets the cache store it trimmed.
    ops.sort_by_key(|&(label, op)| (op.output.is_none(), op.call, label));
    let completed = ops.iter().filter(|(_, op)| op.output.is_some()).count();
    let mut classes: HashMap<String, usize> = HashMap::new();
    let class = ops
        .iter()
        .map(|(_, op)| match op.output {
            Some(_) => NIL,
            None => {
                let next = classes.len();
                *classes.entry(format!("{:?}", op.input)).or_insert(next)
            }
        })
        .collect();

    let mut search = Search {
        ops: &ops,
        line: Timeline::new(&ops),
        set: LinSet::new(ops.len(), completed),
        cache: Cache::default(),
        closures: HashMap::new(),
        class,
        budget: Budget {
            steps: 0,
            max: max_steps,
        },
        path: Vec::new(),
        best: Best::default(),
    };
    match search.run(&init, completed) {
        Ok(true) => Verdict::Linearizable,
        Ok(false) => Verdict::NotLinearizable {
            explanation: explain(
                &init,
                &ops,
                &search.line,
                &search.best.path,
                search.budget.steps,
            ),
        },
        Err(OutOfSteps) => Verdict::Unknown {
            steps: search.budget.steps,
        },
    }
}

/// The step budget ran out.
struct OutOfSteps;

struct Budget {
    steps: u64,
    max: u64,
}

impl Budget {
    fn take(&mut self) -> Result<(), OutOfSteps> {
        if self.steps >= self.max {
            return Err(OutOfSteps);
        }
        self.steps += 1;
        Ok(())
    }
}

struct Search<'a, M: Model> {
    ops: &'a [(usize, &'a Op<M>)],
    line: Timeline,
    set: LinSet,
    cache: Cache<M>,
    /// Run sets already worked out, by pending operations and the states
    /// each of them leads to on its own; see [`Search::runs`].
    closures: HashMap<u64, Vec<Closure<M>>>,
    /// For indeterminate operations, which are interchangeable: those whose
    /// inputs print alike. See [`Search::closure`].
    class: Vec<usize>,
    budget: Budget,
    /// The operations linearized on the way to the current node, in order.
    path: Vec<usize>,
    best: Best,
}

/// A node of the search: a point right after a completed operation was
/// linearized (or the start).
///
/// Each child is a run of indeterminate operations (usually empty) followed
/// by one completed operation. Grouping the search this way lets runs be
/// enumerated breadth-first and deduplicated by the state they produce,
/// keeping only the smallest sets of operations that produce it; with
/// depth-first search over single operations, a handful of pending lost
/// requests would be tried in every order at every point the search
/// backtracks through.
struct Frame<M> {
    state: M,
    /// This node's cache key, for recording it as a dead end.
    key: u64,
    /// Length of `Search::path` at this node.
    path_len: usize,
    /// Nonempty runs from here, worked out once the empty run is exhausted.
    runs: Option<Rc<[Run<M>]>>,
    /// The run whose children are queued: 0 for the empty run, `i` for
    /// `runs[i - 1]`.
    run: usize,
    /// Untried children of that run, most promising last.
    queue: Vec<Child<M>>,
    /// The empty run's children that have been tried, with the states they
    /// led to. A run followed by one of these that ends in the same state is
    /// dominated by it, so it is skipped without a cache lookup.
    tried: Vec<(usize, M)>,
    /// The child being explored: its run and completed operation.
    child: Option<(usize, usize)>,
}

struct Child<M> {
    op: usize,
    state: M,
    /// Leaves the state unchanged (reads, failed compare-and-sets, ...).
    keeps_state: bool,
    /// Its return's position in the timeline.
    deadline: usize,
}

/// A sequence of indeterminate operations and the state it leads to.
struct Run<M> {
    ops: Vec<usize>,
    /// The same operations as a bitset over the node's pending list.
    members: Vec<u64>,
    state: M,
}

/// A memoised run set: which runs exist depends only on the pending
/// operations and on the state each leads to from the node's state, not on
/// that state itself. Nodes the search backtracks through mostly share
/// both, so this saves rebuilding runs of length two and more, which costs
/// a model step per pair of pending operations.
struct Closure<M> {
    pending: Vec<usize>,
    first: Vec<Option<M>>,
    runs: Rc<[Run<M>]>,
}

impl<M: Model> Search<'_, M> {
    /// Depth-first search with an explicit stack; true if a linearization
    /// exists.
    fn run(&mut self, init: &M, completed: usize) -> Result<bool, OutOfSteps> {
        let mut remaining = completed;
        if remaining == 0 {
            return Ok(true);
        }
        let mut stack = vec![self.node(init.clone(), 0)?];
        let mut run_ops: Vec<usize> = Vec::new();
        while let Some(top) = stack.last_mut() {
            if let Some(child) = top.queue.pop() {
                if top.run == 0 && top.runs.is_none() {
                    top.tried.push((child.op, child.state.clone()));
                }
                run_ops.clear();
                if let (Some(runs), true) = (&top.runs, top.run > 0) {
                    run_ops.extend_from_slice(&runs[top.run - 1].ops);
                }
                for &op in run_ops.iter().chain([&child.op]) {
                    self.set.toggle(op);
                }
                let key = self.cache.key(&self.set, &child.state);
                if self.cache.known_to_fail(key, &mut self.set, &child.state) {
                    for &op in run_ops.iter().chain([&child.op]) {
                        self.set.toggle(op);
                    }
                    continue;
                }
                for &op in run_ops.iter().chain([&child.op]) {
                    self.line.lift(op);
                    self.path.push(op);
                }
                top.child = Some((top.run, child.op));
                remaining -= 1;
                if remaining == 0 {
                    return Ok(true);
                }
                let frame = self.node(child.state, key)?;
                stack.push(frame);
                continue;
            }

            // This run's children are exhausted: move on to the next run
            // that does not just lead back to this node's state (the empty
            // run covers that).
            if top.runs.is_none() {
                top.runs = Some(self.runs(&top.state)?);
            }
            let next_run = top.runs.as_ref().and_then(|runs| {
                (top.run..runs.len()).find(|&index| runs[index].state != top.state)
            });
            if let (Some(index), Some(runs)) = (next_run, &top.runs) {
                top.run = index + 1;
                let runs = Rc::clone(runs);
                top.queue = self.children(&runs[index].state, &top.tried)?;
                continue;
            }

            // Every child failed or was pruned: a dead end.
            self.best.record(&self.path, stack.len() - 1);
            let Some(frame) = stack.pop() else { break };
            let Some(parent) = stack.last_mut() else {
                return Ok(false);
            };
            self.cache
                .insert_failed(frame.key, &mut self.set, &frame.state);
            if let Some((run, op)) = parent.child.take() {
                self.line.unlift(op);
                self.set.toggle(op);
                if let (Some(runs), true) = (&parent.runs, run > 0) {
                    for &op in runs[run - 1].ops.iter().rev() {
                        self.line.unlift(op);
                        self.set.toggle(op);
                    }
                }
            }
            self.path.truncate(parent.path_len);
            self.best.truncated(self.path.len());
            remaining += 1;
        }
        Ok(false)
    }

    /// A fresh node with the children of its empty run queued.
    fn node(&mut self, state: M, key: u64) -> Result<Frame<M>, OutOfSteps> {
        let queue = self.children(&state, &[])?;
        Ok(Frame {
            state,
            key,
            path_len: self.path.len(),
            runs: None,
            run: 0,
            queue,
            tried: Vec::new(),
            child: None,
        })
    }

    /// The completed operations that may come next from `state`, ordered so
    /// that the likeliest to lead somewhere are tried first: those that leave
    /// the state alone (a read that matches now is rarely wrong to place now),
    /// then those whose deadline is nearest.
    fn children(&mut self, state: &M, tried: &[(usize, M)]) -> Result<Vec<Child<M>>, OutOfSteps> {
        let mut queue = Vec::new();
        let mut node = self.line.next[self.line.main_head];
        while node != NIL && self.line.is_call[node] {
            let op = self.line.op_of[node];
            self.budget.take()?;
            let (_, operation) = self.ops[op];
            let next = state
                .step(&operation.input, operation.output.as_ref())
                .filter(|next| {
                    !tried
                        .iter()
                        .any(|(other, seen)| *other == op && seen == next)
                });
            if let Some(next) = next {
                queue.push(Child {
                    op,
                    keeps_state: next == *state,
                    deadline: self.line.ret_node[op],
                    state: next,
                });
            }
            node = self.line.next[node];
        }
        queue.sort_by_key(|child| (child.keeps_state, std::cmp::Reverse(child.deadline)));
        Ok(queue)
    }

    /// Every run of pending indeterminate operations from `state` that is not
    /// dominated by a shorter one: a run is left out when another reaches the
    /// same state with a subset of its operations, because everything
    /// possible after the longer run is possible after the shorter one.
    /// Runs back to `state` itself are kept here and skipped by the caller.
    fn runs(&mut self, state: &M) -> Result<Rc<[Run<M>]>, OutOfSteps> {
        let frontier = self.line.first_return();
        let mut pending = Vec::new();
        let mut node = self.line.next[self.line.indet_head];
        while node < frontier {
            pending.push(self.line.op_of[node]);
            node = self.line.next[node];
        }
        // Each pending operation's predecessor among the pending operations
        // of its class, if any.
        let mut last_of_class: HashMap<usize, usize> = HashMap::new();
        let previous: Vec<usize> = pending
            .iter()
            .enumerate()
            .map(|(index, &op)| last_of_class.insert(self.class[op], index).unwrap_or(NIL))
            .collect();
        let mut first: Vec<Option<M>> = Vec::with_capacity(pending.len());
        for (index, &op) in pending.iter().enumerate() {
            let next = match previous[index] {
                NIL => {
                    self.budget.take()?;
                    state.step(&self.ops[op].1.input, None)
                }
                earlier => first[earlier].clone(),
            };
            first.push(next);
        }
        let mut hasher = DefaultHasher::new();
        pending.hash(&mut hasher);
        first.hash(&mut hasher);
        let key = hasher.finish();
        if let Some(known) = self.closures.get(&key).and_then(|closures| {
            closures
                .iter()
                .find(|closure| closure.pending == pending && closure.first == first)
        }) {
            return Ok(Rc::clone(&known.runs));
        }
        let runs: Rc<[Run<M>]> = self.closure(&pending, &previous, &first)?.into();
        self.closures.entry(key).or_default().push(Closure {
            pending,
            first,
            runs: Rc::clone(&runs),
        });
        Ok(runs)
    }

    /// Breadth-first, so that a state is first reached by the smallest runs
    /// and longer runs to it can be discarded as they turn up.
    ///
    /// Pending operations with the same input are interchangeable (all are
    /// already called and none has a deadline), so runs take them in order,
    /// each only after its `previous` one: otherwise, say, ten lost deletes
    /// would give ten runs that differ in nothing but which delete it was,
    /// and the search would explore everything after each of them. That the
    /// inputs are the same is judged by their `Debug` output.
    fn closure(
        &mut self,
        pending: &[usize],
        previous: &[usize],
        first: &[Option<M>],
    ) -> Result<Vec<Run<M>>, OutOfSteps> {
        let words = pending.len().div_ceil(64);
        // For each state reached, the sets of pending operations reaching it.
        let mut seen: HashMap<M, Vec<Vec<u64>>> = HashMap::new();
        let mut runs: Vec<Run<M>> = Vec::new();
        let mut members = vec![0; words];
        for (index, next) in first.iter().enumerate() {
            if let (Some(next), NIL) = (next, previous[index]) {
                members.fill(0);
                members[index / 64] |= 1 << (index % 64);
                if let Some(members) = admit(&mut seen, next, &members) {
                    runs.push(Run {
                        ops: vec![pending[index]],
                        members,
                        state: next.clone(),
                    });
                }
            }
        }
        let mut level = 0..runs.len();
        while !level.is_empty() {
            let end = runs.len();
            for parent in level {
                for (index, &op) in pending.iter().enumerate() {
                    let bit = 1 << (index % 64);
                    let has = |member: usize| {
                        runs[parent].members[member / 64] & (1 << (member % 64)) != 0
                    };
                    if has(index) || (previous[index] != NIL && !has(previous[index])) {
                        continue;
                    }
                    self.budget.take()?;
                    let Some(next) = runs[parent].state.step(&self.ops[op].1.input, None) else {
                        continue;
                    };
                    // Cheap cases of domination, common with writes that
                    // overwrite: the operation changed nothing (the run
                    // without it is as good), or it ends where it would
                    // have on its own.
                    if next == runs[parent].state || first[index].as_ref() == Some(&next) {
                        continue;
                    }
                    members.copy_from_slice(&runs[parent].members);
                    members[index / 64] |= bit;
                    if let Some(members) = admit(&mut seen, &next, &members) {
                        let mut ops = runs[parent].ops.clone();
                        ops.push(op);
                        runs.push(Run {
                            ops,
                            members,
                            state: next,
                        });
                    }
                }
            }
            level = end..runs.len();
        }
        Ok(runs)
    }
}

/// Records that `members` reach `state`, unless a subset of them already
/// does; returns an owned copy of `members` if it was recorded.
fn admit<M: Eq + Hash + Clone>(
    seen: &mut HashMap<M, Vec<Vec<u64>>>,
    state: &M,
    members: &[u64],
) -> Option<Vec<u64>> {
    let subset_of_members = |set: &Vec<u64>| {
        set.iter()
            .zip(members)
            .all(|(reached, ours)| reached & !ours == 0)
    };
    match seen.get_mut(state) {
        Some(sets) if sets.iter().any(subset_of_members) => None,
        Some(sets) => {
            sets.push(members.to_vec());
            Some(members.to_vec())
        }
        None => {
            seen.insert(state.clone(), vec![members.to_vec()]);
            Some(members.to_vec())
        }
    }
}

/// Calls and returns in time order, as two doubly linked lists threaded
/// through one node array: completed operations' calls and returns, and
/// indeterminate operations' calls (which have no return). Node ids are
/// positions in time order, so comparing ids compares times.
struct Timeline {
    is_call: Vec<bool>,
    op_of: Vec<usize>,
    call_node: Vec<usize>,
    ret_node: Vec<usize>,
    next: Vec<usize>,
    prev: Vec<usize>,
    main_head: usize,
    indet_head: usize,
}

impl Timeline {
    fn new<I, O>(ops: &[(usize, &Operation<I, O>)]) -> Self {
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (index, (_, op)) in ops.iter().enumerate() {
            // `false` sorts first: at equal times calls precede returns, so
            // touching intervals count as concurrent.
            events.push((op.call, false, index));
            if op.output.is_some() {
                events.push((op.ret.unwrap_or(u64::MAX), true, index));
            }
        }
        events.sort_unstable();
        let len = events.len();
        let mut line = Timeline {
            is_call: Vec::with_capacity(len),
            op_of: Vec::with_capacity(len),
            call_node: vec![NIL; ops.len()],
            ret_node: vec![NIL; ops.len()],
            next: vec![NIL; len + 2],
            prev: vec![NIL; len + 2],
            main_head: len,
            indet_head: len + 1,
        };
        let mut main_tail = line.main_head;
        let mut indet_tail = line.indet_head;
        for (node, &(_, is_return, op)) in events.iter().enumerate() {
            line.is_call.push(!is_return);
            line.op_of.push(op);
            if is_return {
                line.ret_node[op] = node;
            } else {
                line.call_node[op] = node;
            }
            let tail = if ops[op].1.output.is_some() {
                &mut main_tail
            } else {
                &mut indet_tail
            };
            line.next[*tail] = node;
            line.prev[node] = *tail;
            *tail = node;
        }
        line
    }

    fn unlink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = next;
        if next != NIL {
            self.prev[next] = prev;
        }
    }

    /// Undoes `unlink`; valid only in reverse order of the unlinks, which the
    /// search's stack discipline guarantees.
    fn relink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = node;
        if next != NIL {
            self.prev[next] = node;
        }
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call_node[op]);
        if self.ret_node[op] != NIL {
            self.unlink(self.ret_node[op]);
        }
    }

    fn unlift(&mut self, op: usize) {
        if self.ret_node[op] != NIL {
            self.relink(self.ret_node[op]);
        }
        self.relink(self.call_node[op]);
    }

    /// The first pending return; only completed calls can precede it.
    fn first_return(&self) -> usize {
        let mut node = self.next[self.main_head];
        while node != NIL && self.is_call[node] {
            node = self.next[node];
        }
        node
    }
}

/// The set of linearized operations, with an incrementally maintained
/// Zobrist hash of its completed part so the cache never hashes the whole
/// bitset. The indeterminate part is left out of the hash on purpose: nodes
/// that differ only in it must meet in one cache chain to be compared.
///
/// Completed operations occupy bits `0..completed` in call order;
/// indeterminate ones start at the next word boundary.
struct LinSet {
    words: Vec<u64>,
    completed: usize,
    completed_words: usize,
    zobrist: Vec<u64>,
    hash: u64,
    /// Every completed-region word before this one is all ones; a lower
    /// bound on the first word that is not, refined lazily.
    full_hint: usize,
    /// No completed-region word at or after this one has ever had a bit set.
    touched_end: usize,
}

impl LinSet {
    fn new(ops: usize, completed: usize) -> Self {
        let completed_words = completed.div_ceil(64);
        let indeterminate_words = (ops - completed).div_ceil(64);
        LinSet {
            words: vec![0; completed_words + indeterminate_words],
            completed,
            completed_words,
            zobrist: (0..completed as u64).map(mix).collect(),
            hash: 0,
            full_hint: 0,
            touched_end: 0,
        }
    }

    fn toggle(&mut self, op: usize) {
        if op < self.completed {
            let word = op / 64;
            self.words[word] ^= 1 << (op % 64);
            self.hash ^= self.zobrist[op];
            self.full_hint = self.full_hint.min(word);
            self.touched_end = self.touched_end.max(word + 1);
        } else {
            let bit = op - self.completed;
            self.words[self.completed_words + bit / 64] ^= 1 << (bit % 64);
        }
    }

    /// A canonical short form of the completed part (the number of leading
    /// all-ones words, then the words up to the last non-zero one) and the
    /// indeterminate part.
    fn compact(&mut self) -> (usize, &[u64], &[u64]) {
        let end = self.completed_words;
        let mut first = self.full_hint;
        while first < end && self.words[first] == u64::MAX {
            first += 1;
        }
        self.full_hint = first;
        let mut last = self.touched_end.min(end).max(first);
        while last > first && self.words[last - 1] == 0 {
            last -= 1;
        }
        (first, &self.words[first..last], &self.words[end..])
    }
}

/// Lowe's cache, holding search nodes known to be dead ends.
///
/// A node is pruned if a dead end has the same completed operations
/// linearized, an equal state, and linearized a subset of its indeterminate
/// operations: any way to finish from the node finishes from the dead end
/// too, by leaving out the extra indeterminate operations, which constrain
/// nothing. Exact matches are the special case Lowe describes; the subset
/// rule is what keeps lost requests from multiplying the search, since
/// otherwise every point at which a lost write could have landed would
/// start a fresh copy of the rest of the search. Only finished nodes are
/// recorded: a node still on the stack could otherwise prune a descendant
/// that differs from it by indeterminate operations alone.
///
/// Sets live in one arena of words; entries whose keys are equal are chained.
struct Cache<M> {
    heads: HashMap<u64, usize>,
    entries: Vec<CacheEntry<M>>,
    arena: Vec<u64>,
}

struct CacheEntry<M> {
    chain: usize,
    full_words: usize,
    start: usize,
    completed_len: usize,
    state: M,
}

impl<M> Default for Cache<M> {
    fn default() -> Self {
        Cache {
            heads: HashMap::new(),
            entries: Vec::new(),
            arena: Vec::new(),
        }
    }
}

impl<M: Clone + Eq + Hash> Cache<M> {
    fn key(&self, set: &LinSet, state: &M) -> u64 {
        let mut hasher = DefaultHasher::new();
        state.hash(&mut hasher);
        set.hash ^ hasher.finish()
    }

    fn known_to_fail(&self, key: u64, set: &mut LinSet, state: &M) -> bool {
        let (full_words, completed, indeterminate) = set.compact();
        let mut at = self.heads.get(&key).copied().unwrap_or(NIL);
        while at != NIL {
            let entry = &self.entries[at];
            let stored = &self.arena[entry.start..];
            if entry.full_words == full_words
                && entry.completed_len == completed.len()
                && stored[..completed.len()] == *completed
                && entry.state == *state
                && stored[completed.len()..]
                    .iter()
                    .zip(indeterminate)
                    .all(|(failed, ours)| failed & !ours == 0)
            {
                return true;
            }
            at = entry.chain;
        }
        false
    }

    fn insert_failed(&mut self, key: u64, set: &mut LinSet, state: &M) {
        let (full_words, completed, indeterminate) = set.compact();
        let head = self.heads.insert(key, self.entries.len()).unwrap_or(NIL);
        self.entries.push(CacheEntry {
            chain: head,
            full_words,
            start: self.arena.len(),
            completed_len: completed.len(),
            state: state.clone(),
        });
        self.arena.extend_from_slice(completed);
        self.arena.extend_from_slice(indeterminate);
    }
}

/// The deepest point the search reached, for the explanation. Copying the
/// path every time the search gets deeper would be quadratic, so only the
/// part that changed since the last copy is copied.
#[derive(Default)]
struct Best {
    path: Vec<usize>,
    /// Completed operations in `path`.
    depth: usize,
    /// How long a prefix of the search's path is known to match `path`.
    synced: usize,
}

impl Best {
    fn record(&mut self, path: &[usize], depth: usize) {
        if depth > self.depth {
            self.path.truncate(self.synced);
            self.path.extend_from_slice(&path[self.synced..]);
            self.synced = path.len();
            self.depth = depth;
        }
    }

    fn truncated(&mut self, len: usize) {
        self.synced = self.synced.min(len);
    }
}

/// Describes the failure at the deepest point the search reached: the
/// linearization that got furthest, and why nothing could follow it.
fn explain<M: Model>(
    init: &M,
    ops: &[(usize, &Op<M>)],
    line: &Timeline,
    best: &[usize],
    steps: u64,
) -> String {
    let mut lines = vec![format!(
        "no linearization of these {} operations exists ({steps} search steps)",
        ops.len()
    )];

    let mut state = init.clone();
    let mut replayed = true;
    for &op in best {
        let (_, operation) = ops[op];
        match state.step(&operation.input, operation.output.as_ref()) {
            Some(next) => state = next,
            None => {
                replayed = false;
                break;
            }
        }
    }

    if best.is_empty() {
        lines.push("no operation can be linearized first".to_owned());
    } else {
        let omitted = best.len().saturating_sub(PREFIX_SHOWN);
        let note = if omitted > 0 {
            format!(", the first {omitted} not shown")
        } else {
            String::new()
        };
        lines.push(format!(
            "longest linearizable prefix found ({} operations{note}), in linearization order:",
            best.len()
        ));
        for &op in &best[omitted..] {
            let (label, operation) = ops[op];
            lines.push(format!("  {}", describe(label, operation)));
        }
    }

    let mut linearized = vec![false; ops.len()];
    for &op in best {
        linearized[op] = true;
    }
    let deadline = (0..ops.len())
        .filter(|&op| !linearized[op] && line.ret_node[op] != NIL)
        .min_by_key(|&op| line.ret_node[op]);
    if let Some(deadline) = deadline {
        let limit = line.ret_node[deadline];
        let mut candidates: Vec<usize> = (0..ops.len())
            .filter(|&op| !linearized[op] && line.call_node[op] < limit)
            .collect();
        candidates.sort_by_key(|&op| line.call_node[op]);
        let (label, operation) = ops[deadline];
        lines.push(format!(
            "then {} must take effect before it returns, but no operation called \
             before that return can come next ({} candidates):",
            describe(label, operation),
            candidates.len()
        ));
        for &op in candidates.iter().take(CANDIDATES_SHOWN) {
            let (label, operation) = ops[op];
            let why = if !replayed {
                "not evaluated"
            } else if state
                .step(&operation.input, operation.output.as_ref())
                .is_some()
            {
                "the model accepts it here, but nothing consistent follows"
            } else {
                "the model rejects it here"
            };
            lines.push(format!("  {}: {why}", describe(label, operation)));
        }
        if candidates.len() > CANDIDATES_SHOWN {
            lines.push(format!(
                "  ... and {} more",
                candidates.len() - CANDIDATES_SHOWN
            ));
        }
    }
    if !replayed {
        lines.push(
            "(replaying the prefix through the model failed; is Model::step deterministic?)"
                .to_owned(),
        );
    }
    lines.join("\n")
}

fn describe<I: Debug, O: Debug>(label: usize, op: &Operation<I, O>) -> String {
    let ret = op.ret.map_or_else(|| "-".to_owned(), |ret| ret.to_string());
    let head = format!("#{label} (client {}, [{}, {ret}])", op.client, op.call);
    match &op.output {
        Some(output) => format!("{head} {:?} -> {output:?}", op.input),
        None => format!("{head} {:?} -> ? (indeterminate)", op.input),
    }
}

/// SplitMix64's finaliser, for Zobrist keys.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    // ---- models ----

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct Register(u64);

    #[derive(Clone, Debug)]
    enum RegIn {
        Write(u64),
        Read,
    }

    #[derive(Clone, Debug, PartialEq)]
    enum RegOut {
        Ok,
        Value(u64),
    }

    impl Model for Register {
        type Input = RegIn;
        type Output = RegOut;

        fn step(&self, input: &RegIn, output: Option<&RegOut>) -> Option<Self> {
            match (input, output) {
                (RegIn::Write(v), None | Some(RegOut::Ok)) => Some(Register(*v)),
                (RegIn::Read, None) => Some(self.clone()),
                (RegIn::Read, Some(RegOut::Value(v))) if *v == self.0 => Some(self.clone()),
                _ => None,
            }
        }
    }

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct Cell(u64);

    #[derive(Clone, Debug)]
    enum CasIn {
        Read,
        Write(u64),
        Cas { expect: u64, new: u64 },
    }

    #[derive(Clone, Debug, PartialEq)]
    enum CasOut {
        Value(u64),
        Written,
        Swapped(bool),
    }

    impl Model for Cell {
        type Input = CasIn;
        type Output = CasOut;

        fn step(&self, input: &CasIn, output: Option<&CasOut>) -> Option<Self> {
            match (input, output) {
                (CasIn::Read, None) => Some(self.clone()),
                (CasIn::Read, Some(CasOut::Value(v))) if *v == self.0 => Some(self.clone()),
                (CasIn::Write(v), None | Some(CasOut::Written)) => Some(Cell(*v)),
                (CasIn::Cas { expect, new }, None) => Some(if self.0 == *expect {
                    Cell(*new)
                } else {
                    self.clone()
                }),
                (CasIn::Cas { expect, new }, Some(CasOut::Swapped(ok)))
                    if *ok == (self.0 == *expect) =>
                {
                    Some(if *ok { Cell(*new) } else { self.clone() })
                }
                _ => None,
            }
        }
    }

    /// Sequential execution, to generate histories that really happened.
    trait Exec: Model {
        fn apply(&self, input: &Self::Input) -> (Self, Self::Output);
    }

    impl Exec for Register {
        fn apply(&self, input: &RegIn) -> (Self, RegOut) {
            match input {
                RegIn::Write(v) => (Register(*v), RegOut::Ok),
                RegIn::Read => (self.clone(), RegOut::Value(self.0)),
            }
        }
    }

    impl Exec for Cell {
        fn apply(&self, input: &CasIn) -> (Self, CasOut) {
            match input {
                CasIn::Read => (self.clone(), CasOut::Value(self.0)),
                CasIn::Write(v) => (Cell(*v), CasOut::Written),
                CasIn::Cas { expect, new } => {
                    if self.0 == *expect {
                        (Cell(*new), CasOut::Swapped(true))
                    } else {
                        (self.clone(), CasOut::Swapped(false))
                    }
                }
            }
        }
    }

    // ---- helpers ----

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    type RegOp = Operation<RegIn, RegOut>;

    fn w(client: usize, call: u64, ret: u64, v: u64) -> RegOp {
        Operation {
            client,
            call,
            ret: Some(ret),
            input: RegIn::Write(v),
            output: Some(RegOut::Ok),
        }
    }

    fn r(client: usize, call: u64, ret: u64, v: u64) -> RegOp {
        Operation {
            client,
            call,
            ret: Some(ret),
            input: RegIn::Read,
            output: Some(RegOut::Value(v)),
        }
    }

    fn w_lost(client: usize, call: u64, v: u64) -> RegOp {
        Operation {
            client,
            call,
            ret: None,
            input: RegIn::Write(v),
            output: None,
        }
    }

    fn cas(
        client: usize,
        call: u64,
        ret: Option<u64>,
        expect: u64,
        new: u64,
        ok: Option<bool>,
    ) -> Operation<CasIn, CasOut> {
        Operation {
            client,
            call,
            ret,
            input: CasIn::Cas { expect, new },
            output: ok.map(CasOut::Swapped),
        }
    }

    fn explanation(verdict: Verdict) -> String {
        match verdict {
            Verdict::NotLinearizable { explanation } => explanation,
            other => panic!("expected NotLinearizable, got {other}"),
        }
    }

    const UNBOUNDED: u64 = u64::MAX;

    // ---- hand-written histories ----

    #[test]
    fn empty_history_is_linearizable() {
        assert_eq!(check(Register(0), &[], 0), Verdict::Linearizable);
    }

    #[test]
    fn sequential_write_then_read() {
        let h = [w(0, 0, 10, 1), r(1, 20, 30, 1)];
        assert_eq!(check(Register(0), &h, UNBOUNDED), Verdict::Linearizable);
    }

    #[test]
    fn read_of_a_value_never_written_fails() {
        let h = [w(0, 0, 10, 1), r(1, 5, 30, 7)];
        let text = explanation(check(Register(0), &h, UNBOUNDED));
        assert!(text.contains("#1"), "{text}");
        assert!(text.contains("rejects"), "{text}");
    }

    #[test]
    fn stale_read_after_completed_write_fails() {
        let h = [w(0, 0, 10, 1), w(0, 20, 30, 2), r(1, 40, 50, 1)];
        let text = explanation(check(Register(0), &h, UNBOUNDED));
        assert!(text.contains("Read -> Value(1)"), "{text}");
        // Reading the initial value after a completed write is just as stale.
        let h = [w(0, 0, 10, 1), r(1, 11, 12, 0)];
        assert!(matches!(
            check(Register(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn read_concurrent_with_write_may_see_either_value() {
        for seen in [0, 1] {
            let h = [w(0, 0, 100, 1), r(1, 10, 20, seen)];
            assert_eq!(check(Register(0), &h, UNBOUNDED), Verdict::Linearizable);
        }
    }

    #[test]
    fn touching_intervals_count_as_concurrent() {
        // The read is called at the very instant the write returns, so it may
        // be ordered first.
        let h = [w(0, 0, 10, 1), r(1, 10, 20, 0)];
        assert_eq!(check(Register(0), &h, UNBOUNDED), Verdict::Linearizable);
    }

    #[test]
    fn order_of_concurrent_writes_must_be_agreed_on() {
        // One client sees 1 then 2 then 1 again: impossible with one write of each.
        let h = [
            w(0, 0, 100, 1),
            w(1, 0, 100, 2),
            r(2, 10, 20, 1),
            r(2, 30, 40, 2),
            r(2, 50, 60, 1),
        ];
        assert!(matches!(
            check(Register(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));

        // Two clients each see a consistent order, but not the same one.
        let h = [
            w(0, 0, 100, 1),
            w(1, 0, 100, 2),
            r(2, 10, 20, 1),
            r(2, 30, 40, 2),
            r(3, 10, 20, 2),
            r(3, 30, 40, 1),
        ];
        assert!(matches!(
            check(Register(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));

        // Seeing the same order is fine.
        let h = [
            w(0, 0, 100, 1),
            w(1, 0, 100, 2),
            r(2, 10, 20, 1),
            r(2, 30, 40, 2),
            r(3, 10, 20, 1),
            r(3, 30, 40, 2),
        ];
        assert_eq!(check(Register(0), &h, UNBOUNDED), Verdict::Linearizable);
    }

    #[test]
    fn indeterminate_write_may_apply_late_or_never() {
        // Never observed: fine.
        let h = [w_lost(0, 0, 1), r(1, 10, 20, 0), r(1, 30, 40, 0)];
        assert_eq!(check(Register(0), &h, UNBOUNDED), Verdict::Linearizable);
        // Observed long after the client gave up: fine too.
        let mut late = w_lost(0, 0, 1);
        late.ret = Some(5);
        let h = [late, r(1, 10, 20, 0), r(1, 30, 40, 1), r(1, 50, 60, 1)];
        assert_eq!(check(Register(0), &h, UNBOUNDED), Verdict::Linearizable);
        // But it takes effect once: 0, 1, 0 needs a second write of 0.
        let h = [
            w_lost(0, 0, 1),
            r(1, 10, 20, 0),
            r(1, 30, 40, 1),
            r(1, 50, 60, 0),
        ];
        assert!(matches!(
            check(Register(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));
        // And not before it was called.
        let h = [r(1, 0, 10, 1), w_lost(0, 20, 1)];
        assert!(matches!(
            check(Register(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));
        // An applied lost write does not excuse a read of something else.
        let h = [w_lost(0, 0, 1), r(1, 10, 20, 2)];
        assert!(matches!(
            check(Register(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn indeterminate_ops_are_tried_after_completed_ones_but_still_tried() {
        // Many lost writes of distinct values; only the last read needs one.
        let mut h: Vec<RegOp> = (0..40)
            .map(|i| w_lost(i, i as u64, 100 + i as u64))
            .collect();
        h.push(r(50, 1000, 1010, 0));
        h.push(r(50, 1020, 1030, 139));
        assert_eq!(check(Register(0), &h, UNBOUNDED), Verdict::Linearizable);
    }

    #[test]
    fn identical_lost_requests_are_counted_not_permuted() {
        // Each read of 5 after the write of 0 needs another of the lost
        // writes of 5; which one is immaterial, so the search must not try
        // them all, yet still run out when they are used up.
        let history = |lost: u64, rounds: u64| {
            let mut h: Vec<RegOp> = (0..lost).map(|i| w_lost(100 + i as usize, 0, 5)).collect();
            for round in 0..rounds {
                let t = 10 + round * 10;
                h.push(r(0, t, t + 1, 5));
                h.push(w(0, t + 2, t + 3, 0));
                h.push(r(0, t + 4, t + 5, 0));
            }
            h
        };
        let h = history(20, 20);
        assert_eq!(check(Register(0), &h, 100_000), Verdict::Linearizable);
        let h = history(20, 21);
        let verdict = check(Register(0), &h, 100_000);
        assert!(
            matches!(verdict, Verdict::NotLinearizable { .. }),
            "{verdict}"
        );
    }

    #[test]
    fn answer_without_return_time_must_still_take_effect() {
        let mut read = r(1, 10, 0, 1);
        read.ret = None;
        let h = [read, w(0, 50, 60, 1)];
        assert_eq!(check(Register(0), &h, UNBOUNDED), Verdict::Linearizable);
        let mut read = r(1, 10, 0, 1);
        read.ret = None;
        let h = [read, w(0, 50, 60, 2)];
        assert!(matches!(
            check(Register(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn compare_and_set() {
        let write = |client, call, ret, v| Operation {
            client,
            call,
            ret: Some(ret),
            input: CasIn::Write(v),
            output: Some(CasOut::Written),
        };
        let read = |client, call, ret, v| Operation {
            client,
            call,
            ret: Some(ret),
            input: CasIn::Read,
            output: Some(CasOut::Value(v)),
        };
        // Sequential: write 1, cas 1->2 succeeds, cas 1->3 fails, read 2.
        let h = [
            write(0, 0, 10, 1),
            cas(0, 20, Some(30), 1, 2, Some(true)),
            cas(1, 40, Some(50), 1, 3, Some(false)),
            read(1, 60, 70, 2),
        ];
        assert_eq!(check(Cell(0), &h, UNBOUNDED), Verdict::Linearizable);
        // Two concurrent cas 0->1 cannot both succeed.
        let h = [
            cas(0, 0, Some(10), 0, 1, Some(true)),
            cas(1, 0, Some(10), 0, 1, Some(true)),
        ];
        assert!(matches!(
            check(Cell(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));
        // A cas that claims success when the value did not match.
        let h = [write(0, 0, 10, 5), cas(1, 20, Some(30), 1, 2, Some(true))];
        assert!(matches!(
            check(Cell(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));
        // An indeterminate cas may or may not have happened...
        for seen in [1, 2] {
            let h = [
                write(0, 0, 10, 1),
                cas(1, 20, None, 1, 2, None),
                read(2, 100, 110, seen),
            ];
            assert_eq!(check(Cell(0), &h, UNBOUNDED), Verdict::Linearizable);
        }
        // ...but cannot produce a value it would not write.
        let h = [
            write(0, 0, 10, 1),
            cas(1, 20, None, 1, 2, None),
            read(2, 100, 110, 3),
        ];
        assert!(matches!(
            check(Cell(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));
        // Nor make a later read see its value when it either ran before a
        // completed write that overwrote it, or after it, when it could not
        // succeed.
        let h = [
            write(0, 0, 10, 1),
            cas(1, 20, None, 1, 2, None),
            write(0, 20, 30, 7),
            read(2, 40, 50, 2),
        ];
        assert!(matches!(
            check(Cell(0), &h, UNBOUNDED),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn malformed_history_is_reported() {
        let h = [w(0, 10, 5, 1)];
        let text = explanation(check(Register(0), &h, UNBOUNDED));
        assert!(text.contains("malformed"), "{text}");
    }

    #[test]
    fn step_budget_yields_unknown() {
        let h = [w(0, 0, 10, 1), w(0, 20, 30, 2), r(0, 40, 50, 2)];
        assert_eq!(check(Register(0), &h, 2), Verdict::Unknown { steps: 2 });
        assert_eq!(check(Register(0), &h, 3), Verdict::Linearizable);
    }

    #[test]
    fn partitioned_names_the_failing_key_and_original_index() {
        let h = vec![
            ("a", w(0, 0, 10, 1)),
            ("b", w(1, 0, 10, 2)),
            ("a", r(0, 20, 30, 1)),
            ("b", r(1, 20, 30, 1)),
        ];
        let text = explanation(check_partitioned(|_| Register(0), &h, UNBOUNDED));
        assert!(text.starts_with("key \"b\""), "{text}");
        assert!(text.contains("#3 "), "{text}");
        assert!(!text.contains("#2 "), "{text}");
        // Each key alone: "a" is fine, as is everything with per-key init.
        assert_eq!(
            check_partitioned(|_| Register(0), &h[..3], UNBOUNDED),
            Verdict::Linearizable
        );
        let h = vec![("a", r(0, 0, 10, 5)), ("b", r(0, 0, 10, 6))];
        let init = |key: &&str| Register(if *key == "a" { 5 } else { 6 });
        assert_eq!(
            check_partitioned(init, &h, UNBOUNDED),
            Verdict::Linearizable
        );
        let h = vec![
            ("a", w(0, 0, 10, 1)),
            ("a", r(0, 20, 30, 1)),
            ("b", w(1, 0, 1, 2)),
        ];
        assert_eq!(
            check_partitioned(|_| Register(0), &h, 1),
            Verdict::Unknown { steps: 1 }
        );
    }

    #[test]
    fn trimmed_sets_in_the_cache_are_exact() {
        // The cache compares sets in their trimmed form, so that form must
        // determine the set exactly, whatever order bits come and go in.
        let (completed, total) = (300, 370);
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut set = LinSet::new(total, completed);
        let mut shadow = vec![false; total];
        for round in 0..20_000 {
            // Mostly fill from the front, as the search does, with holes.
            let op = if round % 3 == 0 {
                rng.below(total as u64) as usize
            } else {
                (rng.below(40) as usize + round / 80).min(total - 1)
            };
            set.toggle(op);
            shadow[op] = !shadow[op];
            let (full, window, indeterminate) = set.compact();
            let mut rebuilt = vec![false; total];
            for (bit, slot) in rebuilt.iter_mut().enumerate().take(completed) {
                let word = bit / 64;
                *slot = if word < full {
                    true
                } else {
                    window
                        .get(word - full)
                        .is_some_and(|w| w & (1 << (bit % 64)) != 0)
                };
            }
            for (bit, slot) in rebuilt.iter_mut().enumerate().skip(completed) {
                let index = bit - completed;
                *slot = indeterminate[index / 64] & (1 << (index % 64)) != 0;
            }
            assert_eq!(rebuilt, shadow, "round {round}");
            // Trimmed means trimmed: no all-ones word first, no zero word last.
            assert!(window.first().is_none_or(|&w| w != u64::MAX));
            assert!(window.last().is_none_or(|&w| w != 0));
        }
    }

    // ---- brute-force cross-check ----

    /// Tries every order of every subset that contains all completed
    /// operations and respects real time.
    fn brute_force(state: &Cell, h: &[Operation<CasIn, CasOut>], done: &mut [bool]) -> bool {
        let completed_left = (0..h.len()).any(|i| !done[i] && h[i].output.is_some());
        if !completed_left {
            return true;
        }
        for i in 0..h.len() {
            if done[i] {
                continue;
            }
            let blocked = (0..h.len()).any(|j| {
                j != i
                    && !done[j]
                    && h[j].output.is_some()
                    && h[j].ret.unwrap_or(u64::MAX) < h[i].call
            });
            if blocked {
                continue;
            }
            if let Some(next) = state.step(&h[i].input, h[i].output.as_ref()) {
                done[i] = true;
                let ok = brute_force(&next, h, done);
                done[i] = false;
                if ok {
                    return true;
                }
            }
        }
        false
    }

    /// A random history of at most `max_ops` operations on a three-valued
    /// cell, mostly not linearizable; `lost_in` is the chance (one in
    /// `lost_in`) that an operation is indeterminate.
    fn small_history(
        rng: &mut XorShift,
        max_ops: u64,
        lost_in: u64,
    ) -> Vec<Operation<CasIn, CasOut>> {
        let n = 1 + rng.below(max_ops) as usize;
        (0..n)
            .map(|client| {
                let call = rng.below(20);
                let input = match rng.below(3) {
                    0 => CasIn::Read,
                    1 => CasIn::Write(rng.below(3)),
                    _ => CasIn::Cas {
                        expect: rng.below(3),
                        new: rng.below(3),
                    },
                };
                let output = match (&input, rng.below(lost_in)) {
                    (_, 0) => None,
                    (CasIn::Read, _) => Some(CasOut::Value(rng.below(3))),
                    (CasIn::Write(_), _) => Some(CasOut::Written),
                    (CasIn::Cas { .. }, _) => Some(CasOut::Swapped(rng.below(2) == 0)),
                };
                // Sometimes no return time: for an indeterminate operation
                // that is the usual record, for a completed one it means the
                // answer's arrival time is unknown.
                let ret = match rng.below(8) {
                    0 => None,
                    _ => Some(call + rng.below(10)),
                };
                Operation {
                    client,
                    call,
                    ret,
                    input,
                    output,
                }
            })
            .collect()
    }

    fn compare_with_brute_force(seed: u64, cases: usize, max_ops: u64, lost_in: u64) {
        let mut rng = XorShift(seed);
        let (mut yes, mut no) = (0, 0);
        for _ in 0..cases {
            let h = small_history(&mut rng, max_ops, lost_in);
            let expected = brute_force(&Cell(0), &h, &mut vec![false; h.len()]);
            let verdict = check(Cell(0), &h, UNBOUNDED);
            assert_eq!(
                verdict == Verdict::Linearizable,
                expected,
                "disagreement on {h:#?}: {verdict}"
            );
            if expected {
                yes += 1;
            } else {
                no += 1;
            }
        }
        // Both outcomes are well represented, or the comparison proves little.
        assert!(
            yes > cases / 10 && no > cases / 10,
            "{yes} linearizable, {no} not"
        );
    }

    #[test]
    fn agrees_with_brute_force_on_small_random_histories() {
        compare_with_brute_force(0x1234_5678_9abc_def1, 20_000, 7, 6);
    }

    #[test]
    fn agrees_with_brute_force_when_many_operations_are_indeterminate() {
        compare_with_brute_force(0x2545_f491_4f6c_dd1d, 3_000, 9, 2);
    }

    // ---- long generated histories ----

    /// Runs `ops` operations from `clients` concurrent clients against a
    /// sequential `init`, each taking effect at a random instant strictly
    /// inside its interval. With `lost_percent`, a request may time out
    /// before taking effect (and then take effect later, or never) or lose
    /// its answer after taking effect; both are recorded as indeterminate.
    fn generate<M: Exec>(
        rng: &mut XorShift,
        init: M,
        ops: usize,
        clients: usize,
        lost_percent: u64,
        mut input: impl FnMut(&mut XorShift) -> M::Input,
    ) -> Vec<Operation<M::Input, M::Output>> {
        let mut state = init;
        let mut history: Vec<Operation<M::Input, M::Output>> = Vec::with_capacity(ops);
        // Per client: the operation in flight and whether it took effect.
        let mut in_flight: Vec<Option<(usize, bool)>> = vec![None; clients];
        // Timed out before taking effect; may still take effect.
        let mut zombies: Vec<usize> = Vec::new();
        let mut now = 0;
        while history.len() < ops || in_flight.iter().any(Option::is_some) {
            now += 1 + rng.below(3);
            if !zombies.is_empty() && rng.below(20) == 0 {
                let zombie = zombies.swap_remove(rng.below(zombies.len() as u64) as usize);
                state = state.apply(&history[zombie].input).0;
                continue;
            }
            let client = rng.below(clients as u64) as usize;
            match in_flight[client] {
                None => {
                    if history.len() < ops {
                        in_flight[client] = Some((history.len(), false));
                        history.push(Operation {
                            client,
                            call: now,
                            ret: None,
                            input: input(rng),
                            output: None,
                        });
                    }
                }
                Some((index, false)) => {
                    if rng.below(100) < lost_percent {
                        if rng.below(2) == 0 {
                            zombies.push(index);
                        }
                        in_flight[client] = None;
                    } else {
                        let (next, output) = state.apply(&history[index].input);
                        state = next;
                        history[index].output = Some(output);
                        in_flight[client] = Some((index, true));
                    }
                }
                Some((index, true)) => {
                    if rng.below(100) < lost_percent {
                        history[index].output = None;
                    } else {
                        history[index].ret = Some(now);
                    }
                    in_flight[client] = None;
                }
            }
        }
        history
    }

    fn register_input(rng: &mut XorShift) -> RegIn {
        if rng.below(2) == 0 {
            RegIn::Read
        } else {
            RegIn::Write(rng.below(5))
        }
    }

    fn max_overlap<I, O>(h: &[Operation<I, O>]) -> usize {
        let mut events: Vec<(u64, i32)> = Vec::new();
        for op in h {
            events.push((op.call, 1));
            events.push((op.ret.unwrap_or(op.call), -1));
        }
        events.sort_by_key(|&(t, d)| (t, -d));
        let (mut open, mut max) = (0i32, 0i32);
        for (_, d) in events {
            open += d;
            max = max.max(open);
        }
        max as usize
    }

    fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        println!("{what}: {:?}", start.elapsed());
        out
    }

    const BUDGET: u64 = 2_000_000;

    #[test]
    fn long_register_history_passes_and_corrupted_read_fails() {
        let mut rng = XorShift(0xdead_beef_cafe_f00d);
        let mut h = generate(&mut rng, Register(0), 2_000, 8, 0, register_input);
        assert_eq!(max_overlap(&h), 8);
        let verdict = timed("2000-op register history", || {
            check(Register(0), &h, BUDGET)
        });
        assert_eq!(verdict, Verdict::Linearizable, "{verdict}");

        let read = (h.len() / 2..h.len())
            .find(|&i| matches!(h[i].input, RegIn::Read))
            .unwrap();
        h[read].output = Some(RegOut::Value(99));
        let verdict = timed("2000-op register history, corrupted", || {
            check(Register(0), &h, BUDGET)
        });
        let text = explanation(verdict);
        assert!(text.contains(&format!("#{read} ")), "{text}");
        println!("{text}");
    }

    #[test]
    fn long_history_with_stale_read_fails() {
        // Unique values make the staleness certain: the old value was written
        // once, and another write completed after it and before the read.
        let mut rng = XorShift(0x0123_4567_89ab_cdef);
        let mut next_value = 0;
        let mut h = generate(&mut rng, Register(0), 2_000, 8, 0, |rng| {
            if rng.below(2) == 0 {
                RegIn::Read
            } else {
                next_value += 1;
                RegIn::Write(next_value)
            }
        });
        assert_eq!(check(Register(0), &h, BUDGET), Verdict::Linearizable);
        let write_value = |op: &RegOp| match op.input {
            RegIn::Write(v) => Some(v),
            RegIn::Read => None,
        };
        let read = (h.len() / 2..h.len())
            .find(|&i| matches!(h[i].input, RegIn::Read))
            .unwrap();
        let newer = (0..h.len())
            .filter(|&j| write_value(&h[j]).is_some() && h[j].ret.unwrap() < h[read].call)
            .max_by_key(|&j| h[j].call)
            .unwrap();
        let older = (0..h.len())
            .filter(|&j| write_value(&h[j]).is_some() && h[j].ret.unwrap() < h[newer].call)
            .max_by_key(|&j| h[j].call)
            .unwrap();
        let stale = write_value(&h[older]).unwrap();
        h[read].output = Some(RegOut::Value(stale));
        let verdict = timed("2000-op unique-value history, stale read", || {
            check(Register(0), &h, BUDGET)
        });
        assert!(
            matches!(verdict, Verdict::NotLinearizable { .. }),
            "{verdict}"
        );
    }

    #[test]
    fn long_history_with_lost_requests_passes() {
        let mut rng = XorShift(0x5eed_5eed_5eed_5eed);
        let h = generate(&mut rng, Register(0), 2_000, 8, 3, register_input);
        let lost = h.iter().filter(|op| op.output.is_none()).count();
        assert!(lost > 20, "only {lost} indeterminate operations");
        let verdict = timed("2000-op register history with lost requests", || {
            check(Register(0), &h, BUDGET)
        });
        assert_eq!(verdict, Verdict::Linearizable, "{verdict}");
    }

    fn cas_input(rng: &mut XorShift) -> CasIn {
        match rng.below(3) {
            0 => CasIn::Read,
            1 => CasIn::Write(rng.below(4)),
            _ => CasIn::Cas {
                expect: rng.below(4),
                new: rng.below(4),
            },
        }
    }

    #[test]
    fn long_cas_history_passes_and_corrupted_cas_fails() {
        let mut rng = XorShift(0xfeed_face_dead_c0de);
        let mut h = generate(&mut rng, Cell(0), 2_000, 8, 0, cas_input);
        let verdict = timed("2000-op cas history", || check(Cell(0), &h, BUDGET));
        assert_eq!(verdict, Verdict::Linearizable, "{verdict}");
        // Flip the outcome of a compare-and-set in the middle.
        let index = (h.len() / 2..h.len())
            .find(|&i| matches!(h[i].input, CasIn::Cas { .. }))
            .unwrap();
        let Some(CasOut::Swapped(ok)) = h[index].output else {
            panic!("completed cas expected");
        };
        h[index].output = Some(CasOut::Swapped(!ok));
        let verdict = timed("2000-op cas history, flipped cas", || {
            check(Cell(0), &h, BUDGET)
        });
        // A flipped outcome may happen to be explainable by another order
        // of concurrent operations, but not with these seeds.
        assert!(
            matches!(verdict, Verdict::NotLinearizable { .. }),
            "{verdict}"
        );
    }

    #[test]
    fn long_cas_history_with_lost_requests_passes() {
        let mut rng = XorShift(0x0dd_ba11_cafe_babe);
        let h = generate(&mut rng, Cell(0), 2_000, 8, 2, cas_input);
        let verdict = timed("2000-op cas history with lost requests", || {
            check(Cell(0), &h, BUDGET)
        });
        assert_eq!(verdict, Verdict::Linearizable, "{verdict}");
    }

    #[test]
    fn very_long_history_does_not_overflow_the_stack() {
        let mut rng = XorShift(0x0bad_c0de_0bad_c0de);
        let h = generate(&mut rng, Register(0), 50_000, 8, 0, register_input);
        let verdict = timed("50000-op register history", || {
            check(Register(0), &h, 20_000_000)
        });
        assert_eq!(verdict, Verdict::Linearizable, "{verdict}");
    }

    #[test]
    fn partitioned_long_history() {
        let mut rng = XorShift(0x7777_1111_3333_5555);
        let mut h: Vec<(u32, RegOp)> = Vec::new();
        for key in 0..4u32 {
            let ops = generate(
                &mut rng,
                Register(u64::from(key)),
                500,
                8,
                1,
                register_input,
            );
            h.extend(ops.into_iter().map(|op| (key, op)));
        }
        // Interleave keys the way a recorder appending by return time would.
        h.sort_by_key(|(_, op)| op.ret.unwrap_or(u64::MAX));
        let init = |key: &u32| Register(u64::from(*key));
        assert_eq!(check_partitioned(init, &h, BUDGET), Verdict::Linearizable);
        let bad = h
            .iter()
            .position(|(key, op)| *key == 2 && op.output == Some(RegOut::Value(2)))
            .unwrap();
        h[bad].1.output = Some(RegOut::Value(77));
        let text = explanation(check_partitioned(init, &h, BUDGET));
        assert!(text.starts_with("key 2:"), "{text}");
        assert!(text.contains(&format!("#{bad} ")), "{text}");
    }
}
