//! A fixed-size set of block indexes: which blocks a layer holds.

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    len: u64,
}

impl Bitmap {
    pub fn new(len: u64) -> Self {
        Bitmap {
            words: vec![0; len.div_ceil(64) as usize],
            len,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Grows (never shrinks) to `len` blocks; new blocks are absent.
    pub fn grow(&mut self, len: u64) {
        if len > self.len {
            self.resize(len);
        }
    }

    /// Grows or cuts the map to `len` bits; bits past a cut are gone.
    pub fn resize(&mut self, len: u64) {
        self.words.resize(len.div_ceil(64) as usize, 0);
        if !len.is_multiple_of(64)
            && let Some(last) = self.words.last_mut()
        {
            *last &= (1u64 << (len % 64)) - 1;
        }
        self.len = len;
    }

    /// Whether any bit at or past `i` is set.
    pub fn any_from(&self, i: u64) -> bool {
        if i >= self.len {
            return false;
        }
        let (w, b) = ((i / 64) as usize, i % 64);
        self.words[w] >> b != 0 || self.words[w + 1..].iter().any(|&x| x != 0)
    }

    pub fn get(&self, i: u64) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    pub fn set(&mut self, i: u64, v: bool) {
        if i >= self.len {
            return;
        }
        let w = &mut self.words[(i / 64) as usize];
        if v {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }

    pub fn set_range(&mut self, start: u64, end: u64, v: bool) {
        for i in start..end.min(self.len) {
            self.set(i, v);
        }
    }

    /// Takes away every block present in `other`.
    pub fn subtract(&mut self, other: &Bitmap) {
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w &= !o;
        }
    }

    /// Keeps only the blocks also present in `other`.
    pub fn intersect(&mut self, other: &Bitmap) {
        for (i, w) in self.words.iter_mut().enumerate() {
            *w &= other.words.get(i).copied().unwrap_or(0);
        }
    }

    /// How many blocks are present.
    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// Present blocks, as half-open runs `[start, end)`.
    pub fn runs(&self) -> Vec<(u64, u64)> {
        self.runs_in(0, self.len)
    }

    /// Present blocks of `start..end`, as half-open runs cut to it.
    pub fn runs_in(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let end = end.min(self.len);
        let mut out = Vec::new();
        let mut from = None;
        for i in start..end {
            match (self.get(i), from) {
                (true, None) => from = Some(i),
                (false, Some(s)) => {
                    out.push((s, i));
                    from = None;
                }
                _ => {}
            }
        }
        if let Some(s) = from {
            out.push((s, end));
        }
        out
    }

    /// The first present block at or past `i`, passing over empty words
    /// whole.
    pub fn next_from(&self, i: u64) -> Option<u64> {
        if i >= self.len {
            return None;
        }
        let (mut w, b) = ((i / 64) as usize, i % 64);
        let mut word = self.words[w] >> b << b;
        loop {
            if word != 0 {
                return Some(w as u64 * 64 + u64::from(word.trailing_zeros()));
            }
            w += 1;
            word = *self.words.get(w)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_counts_and_runs() {
        let mut b = Bitmap::new(130);
        b.set_range(3, 6, true);
        b.set(129, true);
        assert!(b.get(3) && b.get(5) && !b.get(6) && b.get(129));
        assert_eq!(b.count(), 4);
        assert_eq!(b.runs(), [(3, 6), (129, 130)]);
        b.set(4, false);
        assert_eq!(b.runs(), [(3, 4), (5, 6), (129, 130)]);
        b.grow(200);
        assert!(!b.get(150));
        assert_eq!(b.len(), 200);
    }

    #[test]
    fn finds_the_next_block_and_the_runs_of_a_range() {
        let mut b = Bitmap::new(300);
        b.set_range(62, 66, true);
        b.set(250, true);
        assert_eq!(b.next_from(0), Some(62));
        assert_eq!(b.next_from(64), Some(64));
        assert_eq!(b.next_from(66), Some(250));
        assert_eq!(b.next_from(251), None);
        assert_eq!(b.next_from(300), None);
        assert_eq!(b.runs_in(63, 65), [(63, 65)]);
        assert_eq!(b.runs_in(0, 64), [(62, 64)]);
        assert_eq!(b.runs_in(64, 400), [(64, 66), (250, 251)]);
        assert!(b.runs_in(100, 200).is_empty());
    }
}
