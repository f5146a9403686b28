//! A binary min-heap of `u16` ids keyed by `(key[id], id)`, over the caller's buffers (the
//! keys live outside the heap, so a caller changes an id's key only while it is not in it).

fn at<T: Copy + Default>(s: &[T], i: usize) -> T {
    s.get(i).copied().unwrap_or_default()
}

fn put<T>(s: &mut [T], i: usize, v: T) {
    if let Some(x) = s.get_mut(i) {
        *x = v;
    }
}

fn less(key: &[f64], a: u16, b: u16) -> bool {
    let (ka, kb) = (at(key, usize::from(a)), at(key, usize::from(b)));
    ka < kb || (ka == kb && a < b)
}

/// Pushes `x` onto `heap[..len]` (nothing when the heap is full).
pub(crate) fn push(heap: &mut [u16], len: &mut usize, x: u16, key: &[f64]) {
    let mut i = *len;
    if i >= heap.len() {
        return;
    }
    put(heap, i, x);
    *len += 1;
    while i > 0 {
        let p = (i - 1) / 2;
        if less(key, at(heap, i), at(heap, p)) {
            heap.swap(i, p);
            i = p;
        } else {
            break;
        }
    }
}

/// Pops the least id of `heap[..len]`.
pub(crate) fn pop(heap: &mut [u16], len: &mut usize, key: &[f64]) -> Option<u16> {
    if *len == 0 {
        return None;
    }
    let top = at(heap, 0);
    *len -= 1;
    let n = *len;
    put(heap, 0, at(heap, n));
    let mut i = 0;
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut m = i;
        if l < n && less(key, at(heap, l), at(heap, m)) {
            m = l;
        }
        if r < n && less(key, at(heap, r), at(heap, m)) {
            m = r;
        }
        if m == i {
            break;
        }
        heap.swap(i, m);
        i = m;
    }
    Some(top)
}
