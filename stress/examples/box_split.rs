//! Where the time of one 64 k-cell box scan goes, against a running
//! `cubed` (issue 32's "box from the cache"): the scan end to end as
//! `cube-stress scale` times it, then one page by hand over the raw
//! socket (request written → first byte of the answer: the daemon's scan
//! and encoding; first → last byte: the transfer; then the client's CRC
//! check and decode), the box page by page with borrowed values
//! (`Client::scan_pages`), a count-only scan (the store's walk alone), and
//! the page's bytes through a `UnixStream` pair between two threads (the
//! transfer floor).
//!
//! ```text
//! cargo build --release -p cube-stress --examples
//! target/release/examples/box_split SOCKET [ROUNDS] [x0,y0,z0 x1,y1,z1]
//! ```
//! The box defaults to 160 × 400 × 1 at the origin (64 000 cells of a
//! 4 M-cell scale data set), namespace `default`. Medians of ROUNDS (9).
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use cube_client::{CellBox, Client, Coord, MAX_SCAN_PAGE_CELLS, NamespaceName};
use cube_protocol::{FrameHeader, HEADER_BYTES, Limits, Request, Response};

const NS: &str = "default";

fn median_ms(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

fn parse_coord(text: &str) -> Coord {
    let v: Vec<i32> = text.split(',').map(|p| p.parse().unwrap()).collect();
    Coord::new(v[0], v[1], v[2])
}

/// One page read by hand: (first byte, last byte, decode) durations and
/// the page's bytes.
fn raw_page(client: &Client, region: &CellBox) -> (Duration, Duration, Duration, usize, usize) {
    let request = Request::Scan {
        ns: NamespaceName::new(NS).unwrap(),
        lo: region.lo(),
        hi: region.hi(),
        limit: MAX_SCAN_PAGE_CELLS,
        count_only: false,
        after: None,
        with_lsn: false,
    };
    let mut out = Vec::new();
    request.encode(1 << 40, &mut out);
    let mut stream = client.stream();
    let started = Instant::now();
    stream.write_all(&out).unwrap();
    let mut header = [0u8; HEADER_BYTES];
    stream.read_exact(&mut header[..1]).unwrap();
    let first = started.elapsed();
    stream.read_exact(&mut header[1..]).unwrap();
    let header = FrameHeader::parse(&header);
    let mut body = vec![0u8; header.body_len as usize];
    stream.read_exact(&mut body).unwrap();
    let last = started.elapsed();
    let decoding = Instant::now();
    header.verify_body(&body).unwrap();
    let limits = Limits {
        max_frame_bytes: u32::MAX,
        max_value_bytes: u32::MAX,
    };
    let cells = match Response::decode(&header, &body, &limits).unwrap() {
        Ok(Response::Scan {
            result: cube_protocol::ScanResult::Cells(cells),
            ..
        }) => cells.len(),
        other => panic!("unexpected answer {other:?}"),
    };
    let decode = decoding.elapsed();
    (
        first,
        last - first,
        decode,
        HEADER_BYTES + body.len(),
        cells,
    )
}

/// `bytes` through a `UnixStream` pair, one thread writing, this one
/// reading: the machine's transfer floor for a page of that size.
fn socket_floor(bytes: usize) -> Duration {
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
    let page = vec![7u8; bytes];
    let writer = std::thread::spawn(move || {
        a.write_all(&page).unwrap();
        a
    });
    let started = Instant::now();
    let mut got = vec![0u8; bytes];
    b.read_exact(&mut got).unwrap();
    let elapsed = started.elapsed();
    writer.join().unwrap();
    elapsed
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let socket = &args[1];
    let rounds: usize = args.get(2).map_or(9, |r| r.parse().unwrap());
    let (lo, hi) = match (args.get(3), args.get(4)) {
        (Some(lo), Some(hi)) => (parse_coord(lo), parse_coord(hi)),
        _ => (Coord::new(0, 0, 0), Coord::new(159, 399, 0)),
    };
    let region = CellBox::new(lo, hi).unwrap();
    let mut client = Client::connect(socket).unwrap();
    let mut borrowed = vec![];
    let (mut e2e, mut count, mut first, mut transfer, mut decode, mut floor) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut bytes, mut cells) = (0, 0);
    for _ in 0..rounds {
        let started = Instant::now();
        let all: Vec<_> = client
            .scan(NS, region, MAX_SCAN_PAGE_CELLS)
            .collect::<Result<_, _>>()
            .unwrap();
        e2e.push(started.elapsed());
        cells = all.len();
        drop(all);
        let started = Instant::now();
        let mut pages = client.scan_pages(NS, region, MAX_SCAN_PAGE_CELLS);
        let (mut seen, mut value_bytes) = (0, 0);
        while let Some(page) = pages.next_page().unwrap() {
            for (_, value) in page {
                seen += 1;
                value_bytes += value.len();
            }
        }
        borrowed.push(started.elapsed());
        assert_eq!(seen, cells);
        assert!(value_bytes >= seen);
        let started = Instant::now();
        let counted = client.scan_count(NS, &region).unwrap();
        count.push(started.elapsed());
        assert_eq!(counted as usize, cells);
        let (f, t, d, b, c) = raw_page(&client, &region);
        first.push(f);
        transfer.push(t);
        decode.push(d);
        bytes = b;
        assert_eq!(c, cells.min(MAX_SCAN_PAGE_CELLS as usize));
        floor.push(socket_floor(bytes));
    }
    println!("box {lo} .. {hi}: {cells} cells, page {bytes} bytes, medians of {rounds}");
    println!(
        "  scan end to end (client.scan.collect)   {:8.3} ms",
        median_ms(e2e)
    );
    println!(
        "  scan_pages, values borrowed             {:8.3} ms",
        median_ms(borrowed)
    );
    println!(
        "  count-only scan (store walk)            {:8.3} ms",
        median_ms(count)
    );
    println!(
        "  raw page: request -> first byte         {:8.3} ms",
        median_ms(first)
    );
    println!(
        "  raw page: first -> last byte            {:8.3} ms",
        median_ms(transfer)
    );
    println!(
        "  raw page: CRC + Response::decode        {:8.3} ms",
        median_ms(decode)
    );
    println!(
        "  socket floor, same bytes, thread pair   {:8.3} ms",
        median_ms(floor)
    );
}
