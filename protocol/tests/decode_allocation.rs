//! Guards the decoders' memory use by counting real allocations: a length field is never trusted, so a 4 GiB claim in a tiny body allocates nothing, and decoding any body allocates in proportion to the body, never to what it claims.
#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use cube_protocol::frame::RESPONSE_BIT;
use cube_protocol::{
    DecodeError, FrameHeader, Limits, MAX_GRANTS, MAX_LISTED_NAMESPACES, NamespaceName, Opcode,
    PROTOCOL_VERSION, Request, Response, StatsEntry,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

/// Forwards to the system allocator, noting request sizes on threads that
/// are currently measuring. Thread-local, so parallel tests do not mix.
struct CountingAllocator;

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = MEASURING.try_with(|on| {
        if on.get() {
            LARGEST.with(|l| l.set(l.get().max(size)));
            TOTAL.with(|t| t.set(t.get() + size));
        }
    });
}

// A global allocator is the one way to observe allocations from safe test
// code; this one only forwards to `System`, so the unsafe is the contract of
// `GlobalAlloc` itself and nothing more.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `f` and returns its result with the largest single allocation and
/// the sum of all allocation requests made on this thread meanwhile.
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LARGEST.with(|l| l.set(0));
    TOTAL.with(|t| t.set(0));
    MEASURING.with(|m| m.set(true));
    let out = f();
    MEASURING.with(|m| m.set(false));
    (out, LARGEST.with(Cell::get), TOTAL.with(Cell::get))
}

fn header(opcode: u16, body: &[u8]) -> FrameHeader {
    FrameHeader {
        body_len: body.len() as u32,
        body_crc32c: 0,
        version: PROTOCOL_VERSION,
        opcode,
        request_id: 1,
    }
}

/// Small fixed allowance for error text and the like.
const SLACK: usize = 1024;

#[test]
fn the_counter_sees_allocations() {
    let ((), largest, total) = measure(|| drop(std::hint::black_box(vec![0u8; 12345])));
    assert_eq!(largest, 12345);
    assert!(total >= 12345);
}

#[test]
fn four_gib_claims_allocate_nothing() {
    let unlimited = Limits {
        max_frame_bytes: u32::MAX,
        max_value_bytes: u32::MAX,
    };
    // put: "default", coord, value length u32::MAX, then three bytes.
    let mut put = vec![7u8];
    put.extend_from_slice(b"default");
    put.extend_from_slice(&[0u8; 12]);
    put.extend_from_slice(&u32::MAX.to_le_bytes());
    put.extend_from_slice(b"abc");
    // get response: found, value length u32::MAX, then three bytes.
    let mut get = vec![0u8, 1];
    get.extend_from_slice(&u32::MAX.to_le_bytes());
    get.extend_from_slice(b"abc");
    for limits in [Limits::default(), unlimited] {
        let (result, largest, total) =
            measure(|| Request::decode(&header(Opcode::Put as u16, &put), &put, &limits).map(drop));
        assert!(
            matches!(
                result,
                Err(DecodeError::Truncated { .. } | DecodeError::TooLarge { .. })
            ),
            "{result:?}"
        );
        // Only the 7-byte namespace name is allocated before the value
        // length is read and refused.
        assert!(
            largest <= name_bytes(7) && total <= name_bytes(7),
            "put decode allocated {total} bytes"
        );

        let opcode = Opcode::Get as u16 | RESPONSE_BIT;
        let (result, largest, total) =
            measure(|| Response::decode(&header(opcode, &get), &get, &limits).map(drop));
        assert!(
            matches!(
                result,
                Err(DecodeError::Truncated { .. } | DecodeError::TooLarge { .. })
            ),
            "{result:?}"
        );
        assert_eq!((largest, total), (0, 0), "get response decode allocated");
    }

    // stats response claiming the maximum 4096 entries in a 3-byte body.
    let stats = [0u8, 0x00, 0x10];
    let opcode = Opcode::Stats as u16 | RESPONSE_BIT;
    let (result, largest, _) =
        measure(|| Response::decode(&header(opcode, &stats), &stats, &Limits::default()).map(drop));
    assert!(
        matches!(result, Err(DecodeError::Truncated { .. })),
        "{result:?}"
    );
    assert_eq!(largest, 0, "no entries reserved for a body that holds none");
}

/// What a decoded namespace name of `len` bytes allocates: the name and the
/// two reference counts of its shared `Arc<str>`, padded to their alignment.
fn name_bytes(len: usize) -> usize {
    (2 * std::mem::size_of::<usize>() + len).next_multiple_of(std::mem::align_of::<usize>())
}

#[test]
fn namespace_lists_claiming_the_maximum_in_tiny_bodies_allocate_nothing() {
    // ns-list answer: 65536 names claimed, 3 bytes present.
    let mut list = vec![0u8];
    list.extend_from_slice(&(MAX_LISTED_NAMESPACES as u32).to_le_bytes());
    list.extend_from_slice(b"\x01ab");
    let opcode = Opcode::NsList as u16 | RESPONSE_BIT;
    let (result, largest, total) =
        measure(|| Response::decode(&header(opcode, &list), &list, &Limits::default()).map(drop));
    assert!(
        matches!(result, Err(DecodeError::Truncated { .. })),
        "{result:?}"
    );
    assert_eq!((largest, total), (0, 0), "ns-list decode allocated");

    // ns-info answer for "q": 256 grants claimed, 4 bytes present. Only the
    // one-byte name is allocated.
    let mut info = vec![0u8, 1, b'q'];
    info.extend_from_slice(&1u64.to_le_bytes());
    info.extend_from_slice(&[1, 0]);
    info.extend_from_slice(&[0u8; 4 + 32]);
    info.extend_from_slice(&(MAX_GRANTS as u16).to_le_bytes());
    info.extend_from_slice(&[0u8; 4]);
    let opcode = Opcode::NsInfo as u16 | RESPONSE_BIT;
    let (result, largest, total) =
        measure(|| Response::decode(&header(opcode, &info), &info, &Limits::default()).map(drop));
    assert!(
        matches!(result, Err(DecodeError::Truncated { .. })),
        "{result:?}"
    );
    assert!(
        largest <= name_bytes(1) && total <= name_bytes(1),
        "ns-info decode allocated {total}"
    );
}

#[test]
fn mget_counts_claiming_the_maximum_in_tiny_bodies_allocate_nothing() {
    // request: "default", 4096 coordinates claimed, one present.
    let mut req = vec![7u8];
    req.extend_from_slice(b"default");
    req.extend_from_slice(&4096u32.to_le_bytes());
    req.extend_from_slice(&[0u8; 12]);
    let (result, largest, _) = measure(|| {
        Request::decode(&header(Opcode::Mget as u16, &req), &req, &Limits::default()).map(drop)
    });
    assert!(
        matches!(result, Err(DecodeError::Truncated { .. })),
        "{result:?}"
    );
    // The name, and room for the one coordinate present.
    assert!(
        largest <= name_bytes(7).max(12),
        "mget decode allocated {largest}"
    );
    // answer: 4096 values claimed, 1 byte present.
    let resp = [0u8, 0x00, 0x10, 0x00, 0x00, 0x00];
    let opcode = Opcode::Mget as u16 | RESPONSE_BIT;
    let (result, largest, _) =
        measure(|| Response::decode(&header(opcode, &resp), &resp, &Limits::default()).map(drop));
    assert!(
        matches!(result, Err(DecodeError::Truncated { .. })),
        "{result:?}"
    );
    assert!(
        largest <= std::mem::size_of::<Option<Vec<u8>>>(),
        "mget answer decode allocated {largest}"
    );
}

fn any_opcode() -> impl Strategy<Value = u16> {
    prop_oneof![
        select(Opcode::ALL.to_vec()).prop_map(|op| op as u16),
        select(Opcode::ALL.to_vec()).prop_map(|op| op as u16 | RESPONSE_BIT),
        Just(RESPONSE_BIT),
    ]
}

/// Bodies that start like real messages (status byte, lengths) so decoding
/// gets past the first field, then carry noise.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..4096),
        (
            any::<u8>().prop_map(|b| b % 2),
            any::<u16>(),
            vec(any::<u8>(), 0..4096)
        )
            .prop_map(|(status, count, rest)| {
                let mut b = vec![status];
                b.extend_from_slice(&count.to_le_bytes());
                b.extend_from_slice(&rest);
                b
            }),
        // ok status, found, any value length: the get response path.
        (any::<u32>(), vec(any::<u8>(), 0..4096)).prop_map(|(len, rest)| {
            let mut b = vec![0u8, 1];
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&rest);
            b
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A request decode allocates at most about the body's size (the name,
    /// the value and an error message), whatever the body claims.
    #[test]
    fn request_decode_allocates_at_most_the_body(opcode in any_opcode(), body in body()) {
        let h = header(opcode, &body);
        let (_, largest, total) =
            measure(|| Request::decode(&h, &body, &Limits::default()).map(drop));
        prop_assert!(largest <= body.len() + SLACK, "largest {largest} for {} bytes", body.len());
        prop_assert!(total <= body.len() + 2 * SLACK, "total {total} for {} bytes", body.len());
    }

    /// A response decode allocates in proportion to the body: strings and
    /// values are at most the body, and the stats list reserves one entry per
    /// 3 body bytes at most.
    #[test]
    fn response_decode_allocates_in_proportion_to_the_body(opcode in any_opcode(), body in body()) {
        let h = header(opcode, &body);
        let (_, largest, _) =
            measure(|| Response::decode(&h, &body, &Limits::default()).map(drop));
        // Stats, checkpoint and backup answers are all lists of named figures.
        let listed = [Opcode::Stats, Opcode::Checkpoint, Opcode::Backup];
        let entries = if listed.iter().any(|op| opcode == *op as u16 | RESPONSE_BIT) {
            std::mem::size_of::<StatsEntry>() * (body.len() / 3)
        } else if opcode == Opcode::NsList as u16 | RESPONSE_BIT {
            // A listed name takes at least 2 body bytes.
            std::mem::size_of::<NamespaceName>() * (body.len() / 2)
        } else if opcode == Opcode::Mget as u16 | RESPONSE_BIT {
            // A missing cell takes 1 body byte.
            std::mem::size_of::<Option<Vec<u8>>>() * body.len()
        } else {
            0
        };
        let bound = body.len().max(entries) + SLACK;
        prop_assert!(largest <= bound, "largest {largest} for {} bytes (bound {bound})", body.len());
    }
}

/// A batch claiming more operations than a batch may hold is refused before
/// any is decoded, with `limit_exceeded` (a past bug: a 16 MiB frame
/// of empty puts decoded into about a million operations, 100 MB, before
/// the server refused the count).
#[test]
fn a_batch_over_its_operation_count_is_refused_before_decoding() {
    use cube_protocol::{BatchOp, Coord, ErrorCode, HEADER_BYTES, MAX_BATCH_OPS};
    let ops = vec![
        BatchOp::Put {
            coord: Coord::new(1, 2, 3),
            value: Vec::new(),
        };
        MAX_BATCH_OPS as usize + 1
    ];
    let request = Request::Batch {
        ns: NamespaceName::new("default").unwrap(),
        ops,
    };
    let mut frame = Vec::new();
    request.encode(1, &mut frame);
    let head: [u8; HEADER_BYTES] = frame[..HEADER_BYTES].try_into().unwrap();
    let header = FrameHeader::parse(&head);
    let body = &frame[HEADER_BYTES..];
    let limits = Limits::default();
    let (result, _, total) = measure(|| Request::decode(&header, body, &limits).map(drop));
    match result {
        Err(error @ DecodeError::TooMany { .. }) => {
            assert_eq!(error.code(), ErrorCode::LimitExceeded, "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert!(total <= SLACK, "refusing the count allocated {total} bytes");
}
