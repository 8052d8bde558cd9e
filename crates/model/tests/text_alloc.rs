//! The streaming detokenizer does not allocate per token (counting global allocator with
//! thread-local counts, so other test threads do not interfere).

use std::sync::Arc;

use model::text::{Detokenizer, SentencePiece};
use testkit::thread_allocations as allocs;

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

#[test]
fn detokenizer_push_does_not_allocate() {
    testkit::assert_thread_meter_sees_allocations();

    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/spm/unigram_bytes_nfkc.model"
    );
    let sp = Arc::new(SentencePiece::load(path).unwrap());
    let mut ids = sp.encode("Hello world! café 你好 🦀 ＡＢＣ");
    ids.extend([0, 3, 1, 2, 100_000]);
    ids.extend(0..sp.vocab_size() as u32);
    let mut d = Detokenizer::new(sp);
    let before = allocs();
    let mut bytes = 0;
    for _ in 0..3 {
        for &id in &ids {
            bytes += d.push(id).len();
        }
        bytes += d.flush().len();
        d.reset();
    }
    assert_eq!(allocs() - before, 0, "allocations while detokenizing");
    assert!(bytes > 1000);
}
