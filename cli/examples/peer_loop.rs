//! One trace's alloc/free sequence through our allocator, for profilers:
//! `valgrind --tool=callgrind target/release/examples/peer_loop TRACE`.

#[path = "../benches/common/peers.rs"]
mod peers;

fn main() {
    let path = std::env::args().nth(1).expect("trace");
    let seq = peers::load(&path);
    let mut ours = peers::Ours::new(&seq);
    assert_eq!(ours.run(&seq), 0);
}
