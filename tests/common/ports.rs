//! Ports for the servers tests start as separate processes, shared by the
//! test crates (`#[path]`-included: not a test target of its own).

/// A port that is free now and stays ours across node restarts: taken
/// below Linux's ephemeral range (32768+), so no outgoing connection of
/// another test can be handed it as its local port while a stopped node
/// waits to bind it again. Each test process starts at its own offset.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id() * 379) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN)
}
