//! Helpers for unit tests only: a small deterministic random source, so a test
//! that draws many cases draws the same ones on every run, and the sizes figure
//! tests read from the environment. Never built outside `cfg(test)`.

/// The number in environment variable `name`, or `default` if it is unset or not
/// a number (figure tests take their sizes this way).
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Xorshift64: the same sequence for the same (nonzero) seed.
pub struct Xorshift(u64);

impl Xorshift {
    pub fn new(seed: u64) -> Self {
        assert_ne!(seed, 0, "xorshift stays at zero");
        Xorshift(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A value below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
