//! The bandwidth probe's copy kernel copies: the destination equals the source after a pass, and a
//! pass reports a positive bandwidth.

mod common;

use gpu::BandwidthProbe;

#[test]
fn probe_copies_the_whole_buffer() {
    let Some(ctx) = common::context() else { return };
    let p = BandwidthProbe::new(&ctx, 1).unwrap();
    assert_eq!(p.bytes(), 1 << 20);
    let pattern: Vec<u32> = (0..1237u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    p.fill_source(&pattern);
    let gbps = p.measure().unwrap();
    assert!(gbps > 0.0 && gbps.is_finite(), "{gbps}");
    let n = (p.bytes() / 4) as usize;
    let got = p.read_destination(n).unwrap();
    let want: Vec<u32> = pattern.iter().copied().cycle().take(n).collect();
    assert_eq!(got, want);
}
