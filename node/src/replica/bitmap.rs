//! A fixed-size set of block indexes: which blocks a layer holds.
//!
//! The set is cut into pages of `PAGE_BITS` blocks (128 MiB of the volume
//! at 4 KiB a block). A page that holds no block or every block is a
//! mark, not memory. One bit per block took 32 MiB per TiB of the volume
//! for a layer that holds all of it, and for every copy of a map (a
//! second handle of a layer, a fill's map of what it holds) whatever the
//! layer held. Every walk (`runs_in`, `next_from`, `count`) passes over
//! a mark, and over an empty or full word, whole: it went bit by bit,
//! and a freeze walks its head's map with the volume's I/O paused (a
//! small head on a volume of 1 TiB: 175 ms paused, against 4.6 ms on one
//! of 1 GiB; performance.md, the freeze bench).
//!
//! A page is kept in one form only (`Page`): empty or full as a mark,
//! otherwise its words with how many bits are set. So two sets of the
//! same blocks are equal as values. It owns the set in memory, nothing
//! on the disk.

/// Words in a page.
const PAGE_WORDS: usize = 512;

/// Blocks in a page: 32,768 (4 KiB of words when it is neither empty nor
/// full).
const PAGE_BITS: u64 = 64 * PAGE_WORDS as u64;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Page {
    /// No block.
    Empty,
    /// Every block of the page (never the last page when the set ends
    /// inside it).
    Full,
    /// Some blocks, never none nor all: the words, and how many bits of
    /// them are set.
    Part(Box<[u64; PAGE_WORDS]>, u32),
}

impl Page {
    /// The page as words, whatever its form.
    fn words(&self) -> Box<[u64; PAGE_WORDS]> {
        match self {
            Page::Empty => Box::new([0; PAGE_WORDS]),
            Page::Full => Box::new([u64::MAX; PAGE_WORDS]),
            Page::Part(w, _) => w.clone(),
        }
    }

    /// The page with each word made `f` of it and of the same word of
    /// `theirs`, in its one form.
    fn with(&self, theirs: &[u64; PAGE_WORDS], f: impl Fn(u64, u64) -> u64) -> Page {
        let mut words = self.words();
        for (w, t) in words.iter_mut().zip(theirs.iter()) {
            *w = f(*w, *t);
        }
        Page::of(words)
    }

    /// The page of `words`, in its one form.
    fn of(words: Box<[u64; PAGE_WORDS]>) -> Page {
        let ones: u32 = words.iter().map(|w| w.count_ones()).sum();
        Page::counted(words, ones)
    }

    /// The page of `words` of which `ones` bits are set, in its one form.
    fn counted(words: Box<[u64; PAGE_WORDS]>, ones: u32) -> Page {
        match u64::from(ones) {
            0 => Page::Empty,
            PAGE_BITS => Page::Full,
            _ => Page::Part(words, ones),
        }
    }

    /// Word `w` of the page.
    fn word(&self, w: usize) -> u64 {
        match self {
            Page::Empty => 0,
            Page::Full => u64::MAX,
            Page::Part(words, _) => words[w],
        }
    }

    fn ones(&self) -> u64 {
        match self {
            Page::Empty => 0,
            Page::Full => PAGE_BITS,
            Page::Part(_, n) => u64::from(*n),
        }
    }

    /// Sets (`v`) or clears the bits of `mask` in word `w`.
    fn apply(&mut self, w: usize, mask: u64, v: bool) {
        let (mut words, ones) = match std::mem::replace(self, Page::Empty) {
            Page::Empty if !v => return,
            Page::Full if v => {
                *self = Page::Full;
                return;
            }
            Page::Part(words, ones) => (words, ones),
            mark => {
                let ones = mark.ones() as u32;
                (mark.words(), ones)
            }
        };
        let before = words[w];
        let after = if v { before | mask } else { before & !mask };
        words[w] = after;
        *self = Page::counted(words, ones - before.count_ones() + after.count_ones());
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bitmap {
    pages: Vec<Page>,
    len: u64,
}

impl Bitmap {
    pub fn new(len: u64) -> Self {
        Bitmap {
            pages: vec![Page::Empty; len.div_ceil(PAGE_BITS) as usize],
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
        self.pages
            .resize(len.div_ceil(PAGE_BITS) as usize, Page::Empty);
        if len < self.len && !len.is_multiple_of(PAGE_BITS) {
            // The new last page keeps only its bits below the cut.
            let keep = len % PAGE_BITS;
            if let Some(last) = self.pages.last_mut() {
                let mut words = last.words();
                for (w, word) in words.iter_mut().enumerate() {
                    let from = w as u64 * 64;
                    if from >= keep {
                        *word = 0;
                    } else if keep - from < 64 {
                        *word &= (1u64 << (keep - from)) - 1;
                    }
                }
                *last = Page::of(words);
            }
        }
        self.len = len;
    }

    /// Whether any bit at or past `i` is set.
    pub fn any_from(&self, i: u64) -> bool {
        self.next_from(i).is_some()
    }

    pub fn get(&self, i: u64) -> bool {
        i < self.len && {
            let at = i % PAGE_BITS;
            self.pages[(i / PAGE_BITS) as usize].word((at / 64) as usize) & (1 << (at % 64)) != 0
        }
    }

    pub fn set(&mut self, i: u64, v: bool) {
        self.set_range(i, i + 1, v);
    }

    /// Sets (`v`) or clears every bit of `start..end` (cut to the set's
    /// length): a whole page at once, otherwise a word at a time.
    pub fn set_range(&mut self, start: u64, end: u64, v: bool) {
        let end = end.min(self.len);
        let mut i = start;
        while i < end {
            let p = (i / PAGE_BITS) as usize;
            let page_end = (p as u64 + 1) * PAGE_BITS;
            if i.is_multiple_of(PAGE_BITS) && page_end <= end {
                self.pages[p] = if v { Page::Full } else { Page::Empty };
                i = page_end;
                continue;
            }
            let upto = end.min(page_end);
            while i < upto {
                let at = i % PAGE_BITS;
                let bit = at % 64;
                let n = (upto - i).min(64 - bit);
                let mask = if n == 64 {
                    u64::MAX
                } else {
                    ((1u64 << n) - 1) << bit
                };
                self.pages[p].apply((at / 64) as usize, mask, v);
                i += n;
            }
        }
    }

    /// Takes away every block present in `other`.
    pub fn subtract(&mut self, other: &Bitmap) {
        for (p, o) in self.pages.iter_mut().zip(&other.pages) {
            *p = match (&*p, o) {
                (Page::Empty, _) | (_, Page::Full) => Page::Empty,
                (_, Page::Empty) => continue,
                (_, Page::Part(theirs, _)) => p.with(theirs, |w, t| w & !t),
            };
        }
    }

    /// Keeps only the blocks also present in `other`.
    pub fn intersect(&mut self, other: &Bitmap) {
        for (i, p) in self.pages.iter_mut().enumerate() {
            *p = match (&*p, other.pages.get(i).unwrap_or(&Page::Empty)) {
                (Page::Empty, _) | (_, Page::Empty) => Page::Empty,
                (_, Page::Full) => continue,
                (_, Page::Part(theirs, _)) => p.with(theirs, |w, t| w & t),
            };
        }
    }

    /// How many blocks are present.
    pub fn count(&self) -> u64 {
        self.pages.iter().map(Page::ones).sum()
    }

    /// Present blocks, as half-open runs `[start, end)`.
    pub fn runs(&self) -> Vec<(u64, u64)> {
        self.runs_in(0, self.len)
    }

    /// Present blocks of `start..end`, as half-open runs cut to it.
    pub fn runs_in(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let end = end.min(self.len);
        let mut out = Vec::new();
        let mut i = start;
        while i < end {
            let Some(s) = self.next_from(i).filter(|&s| s < end) else {
                break;
            };
            let e = self.next_clear_from(s).min(end);
            out.push((s, e));
            i = e;
        }
        out
    }

    /// The first present block at or past `i`, passing over empty pages
    /// and words whole.
    pub fn next_from(&self, i: u64) -> Option<u64> {
        self.next_where(i, false)
    }

    /// The first absent block at or past `i`, passing over full pages and
    /// words whole; the set's length when there is none.
    fn next_clear_from(&self, i: u64) -> u64 {
        self.next_where(i, true).unwrap_or(self.len)
    }

    /// The first block at or past `i` that is present, or with `absent`
    /// absent.
    fn next_where(&self, i: u64, absent: bool) -> Option<u64> {
        // Absent blocks are looked for as the set bits of the words
        // flipped; the pages passed over whole are then the full ones.
        let (skip, flip) = if absent {
            (Page::Full, u64::MAX)
        } else {
            (Page::Empty, 0)
        };
        let mut i = i;
        while i < self.len {
            let p = (i / PAGE_BITS) as usize;
            let page = &self.pages[p];
            if *page == skip {
                i = (p as u64 + 1) * PAGE_BITS;
                continue;
            }
            let at = i % PAGE_BITS;
            let mut w = (at / 64) as usize;
            let mut word = (page.word(w) ^ flip) >> (at % 64) << (at % 64);
            loop {
                if word != 0 {
                    let found =
                        p as u64 * PAGE_BITS + w as u64 * 64 + u64::from(word.trailing_zeros());
                    return (found < self.len).then_some(found);
                }
                w += 1;
                if w == PAGE_WORDS {
                    break;
                }
                word = page.word(w) ^ flip;
            }
            i = (p as u64 + 1) * PAGE_BITS;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    #[test]
    fn a_page_held_whole_or_not_at_all_is_a_mark_and_sets_of_the_same_blocks_are_equal() {
        let len = 3 * PAGE_BITS + 100;
        let mut a = Bitmap::new(len);
        a.set_range(PAGE_BITS, 2 * PAGE_BITS, true);
        assert_eq!(a.pages[1], Page::Full);
        assert_eq!(a.count(), PAGE_BITS);
        // The same blocks set a few at a time end in the same form.
        let mut b = Bitmap::new(len);
        for s in (PAGE_BITS..2 * PAGE_BITS).step_by(16) {
            b.set_range(s, s + 16, true);
        }
        assert_eq!(a, b);
        // Cleared again a block at a time: an empty page.
        for i in PAGE_BITS..2 * PAGE_BITS {
            b.set(i, false);
        }
        assert_eq!(b, Bitmap::new(len));
        // The last page, cut short, is never full: a grow must not make
        // blocks present.
        a.set_range(3 * PAGE_BITS, len, true);
        assert!(matches!(a.pages[3], Page::Part(_, 100)));
        a.grow(4 * PAGE_BITS);
        assert_eq!(a.runs(), [(PAGE_BITS, 2 * PAGE_BITS), (3 * PAGE_BITS, len)]);
        a.resize(PAGE_BITS + 5);
        assert_eq!(a.runs(), [(PAGE_BITS, PAGE_BITS + 5)]);
        a.grow(len);
        assert_eq!(a.runs(), [(PAGE_BITS, PAGE_BITS + 5)]);
    }

    #[test]
    fn a_large_sparse_set_costs_its_pages_not_its_length() {
        // A volume of 1 TiB: 2^28 blocks.
        let mut b = Bitmap::new(1 << 28);
        let some = b
            .pages
            .iter()
            .filter(|p| matches!(p, Page::Part(..)))
            .count();
        assert_eq!(some, 0);
        b.set_range(5 << 20, (5 << 20) + 16, true);
        b.set_range(0, 1 << 27, true);
        let some = b
            .pages
            .iter()
            .filter(|p| matches!(p, Page::Part(..)))
            .count();
        assert_eq!(some, 0, "half the volume set whole is marks only");
        assert_eq!(b.runs(), [(0, 1 << 27)]);
        assert_eq!(b.count(), 1 << 27);
    }

    /// What one operation does, on the set and on a model of one bool per
    /// block.
    #[derive(Clone, Debug)]
    enum Op {
        Set(u64, u64, bool),
        Resize(u64),
        Subtract(Vec<(u64, u64)>),
        Intersect(Vec<(u64, u64)>),
    }

    /// A block index up to `max`, half of them at or next to a page's or a
    /// word's edge, where the forms change.
    fn at(max: u64) -> impl Strategy<Value = u64> {
        let edge = prop_oneof![
            Just(0u64),
            Just(1),
            Just(63),
            Just(64),
            Just(65),
            Just(PAGE_BITS - 1),
        ];
        prop_oneof![
            0..max,
            (0..max.div_ceil(PAGE_BITS) + 1, edge, any::<bool>()).prop_map(move |(p, e, back)| {
                let at = p * PAGE_BITS + e;
                if back {
                    at.saturating_sub(2 * e + 1)
                } else {
                    at
                }
            }),
        ]
    }

    /// A run's length: often a whole page or two, or one block short or
    /// past them.
    fn span() -> impl Strategy<Value = u64> {
        prop_oneof![
            0..PAGE_BITS + 200,
            (1..3u64, -1..2i64).prop_map(|(n, d)| (n * PAGE_BITS).saturating_add_signed(d)),
        ]
    }

    fn op(len: u64) -> impl Strategy<Value = Op> {
        let runs = || proptest::collection::vec((at(len), span()), 0..4);
        prop_oneof![
            4 => (at(len + 70), span(), any::<bool>()).prop_map(|(s, n, v)| Op::Set(s, s + n, v)),
            1 => at(len + PAGE_BITS).prop_map(Op::Resize),
            1 => runs().prop_map(Op::Subtract),
            1 => runs().prop_map(Op::Intersect),
        ]
    }

    fn other_of(len: u64, runs: &[(u64, u64)]) -> (Bitmap, Vec<bool>) {
        let (mut b, mut m) = (Bitmap::new(len), vec![false; len as usize]);
        for &(s, n) in runs {
            b.set_range(s, s + n, true);
            for x in s..(s + n).min(len) {
                m[x as usize] = true;
            }
        }
        (b, m)
    }

    fn model_runs(m: &[bool], start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for i in start..end.min(m.len() as u64) {
            if m[i as usize] {
                match out.last_mut() {
                    Some((_, e)) if *e == i => *e += 1,
                    _ => out.push((i, i + 1)),
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn the_set_holds_what_one_bool_per_block_holds(
            len in at(3 * PAGE_BITS).prop_map(|n| n.max(1)),
            ops in proptest::collection::vec(op(3 * PAGE_BITS), 1..12),
            probes in proptest::collection::vec((at(4 * PAGE_BITS), span()), 8),
        ) {
            let mut b = Bitmap::new(len);
            let mut m = vec![false; len as usize];
            for o in &ops {
                match o {
                    Op::Set(s, e, v) => {
                        b.set_range(*s, *e, *v);
                        for x in *s..(*e).min(m.len() as u64) {
                            m[x as usize] = *v;
                        }
                    }
                    Op::Resize(n) => {
                        b.resize(*n);
                        m.resize(*n as usize, false);
                    }
                    Op::Subtract(runs) => {
                        let (o, om) = other_of(len, runs);
                        b.subtract(&o);
                        for (x, y) in m.iter_mut().zip(&om) {
                            *x &= !y;
                        }
                    }
                    Op::Intersect(runs) => {
                        let (o, om) = other_of(len, runs);
                        b.intersect(&o);
                        for (i, x) in m.iter_mut().enumerate() {
                            *x &= om.get(i).copied().unwrap_or(false);
                        }
                    }
                }
                prop_assert_eq!(b.len(), m.len() as u64);
                prop_assert_eq!(b.count(), m.iter().filter(|x| **x).count() as u64);
                prop_assert_eq!(b.runs(), model_runs(&m, 0, m.len() as u64));
                // Equal to the same blocks set one run at a time.
                let mut again = Bitmap::new(m.len() as u64);
                for (s, e) in model_runs(&m, 0, m.len() as u64) {
                    again.set_range(s, e, true);
                }
                prop_assert_eq!(&again, &b);
            }
            let n = m.len() as u64;
            for &(s, w) in &probes {
                prop_assert_eq!(b.get(s), s < n && m[s as usize]);
                prop_assert_eq!(b.runs_in(s, s + w), model_runs(&m, s, s + w));
                let next = (s..n).find(|&i| m[i as usize]);
                prop_assert_eq!(b.next_from(s), next);
                prop_assert_eq!(b.any_from(s), next.is_some());
            }
        }
    }
}
