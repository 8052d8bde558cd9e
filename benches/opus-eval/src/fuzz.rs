fn main() {
    let mut seed: u64 = 0x1234_5678_9abc_def1;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut dec = opus_rs::OpusDecoder::new(24000, 1).unwrap();
    let mut out = vec![0f32; 2880];
    let (mut ok, mut err, mut panics) = (0u64, 0u64, 0u64);
    std::panic::set_hook(Box::new(|_| {}));
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(200_000);
    for i in 0..n {
        let len = (next() % 400) as usize + 1;
        let mut p: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if i % 3 == 0 {
            p[0] = p[0] & 0xFC;
        } // code 0 single frame: mostly valid TOCs
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            dec.decode(&p, 2880, &mut out)
        }));
        match r {
            Ok(Ok(_)) => ok += 1,
            Ok(Err(_)) => err += 1,
            Err(_) => {
                panics += 1;
                if panics < 4 {
                    eprintln!("panic on {:02x?}", &p[..p.len().min(8)]);
                }
                dec = opus_rs::OpusDecoder::new(24000, 1).unwrap();
            }
        }
    }
    println!("ok {ok} err {err} panics {panics}");
}
