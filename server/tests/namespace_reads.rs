//! Guards that a connection's `get`s follow namespace drops and re-creations made on other connections (each connection remembers the namespace it read last): after a drop the name is unknown, after a re-create it is empty, and never does an old value come back, also with reads running while the drops happen.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cube_client::{Coord, ErrorCode, LocalDaemon, NamespaceName, NamespaceSpec};

fn name(text: &str) -> NamespaceName {
    NamespaceName::new(text).unwrap()
}

#[test]
fn a_reader_sees_a_drop_and_a_re_create_made_on_another_connection() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut reader = daemon.client().unwrap();
    let mut admin = daemon.client().unwrap();
    let ns = name("rooms");
    let c = Coord::new(-3, 4, i32::MAX);
    admin.ns_create(&ns, &NamespaceSpec::default()).unwrap();
    admin.put("rooms", c, b"first life").unwrap();
    admin.put("default", c, b"in default").unwrap();
    for _ in 0..3 {
        assert_eq!(
            reader.get("rooms", c).unwrap(),
            Some(b"first life".to_vec())
        );
    }

    admin.ns_drop(&ns).unwrap();
    let err = reader.get("rooms", c).unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::NoSuchNamespace), "{err}");
    // Other namespaces are untouched.
    assert_eq!(
        reader.get("default", c).unwrap(),
        Some(b"in default".to_vec())
    );

    admin.ns_create(&ns, &NamespaceSpec::default()).unwrap();
    assert_eq!(reader.get("rooms", c).unwrap(), None);
    admin.put("rooms", c, b"second life").unwrap();
    assert_eq!(
        reader.get("rooms", c).unwrap(),
        Some(b"second life".to_vec())
    );
}

#[test]
fn reads_racing_drops_never_see_a_value_from_an_earlier_life() {
    let daemon = LocalDaemon::start_fresh(&[]).unwrap();
    let mut admin = daemon.client().unwrap();
    let ns = name("churn");
    let c = Coord::new(1, 2, 3);
    let stop = Arc::new(AtomicBool::new(false));
    // Life n writes "life n"; a reader may see "life m" for the m it is
    // racing, or no value, or no namespace, but never go back to an
    // earlier life than one it has seen, and at the end it reads the last.
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let mut client = daemon.client().unwrap();
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut newest = 0u32;
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match client.get("churn", c) {
                        Ok(Some(value)) => {
                            let text = String::from_utf8(value).unwrap();
                            let life: u32 = text.strip_prefix("life ").unwrap().parse().unwrap();
                            assert!(life >= newest, "read life {life} after life {newest}");
                            newest = life;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            assert_eq!(e.server_code(), Some(ErrorCode::NoSuchNamespace), "{e}")
                        }
                    }
                    reads += 1;
                }
                // The last life is in place: this connection reads it,
                // whatever it read before.
                (reads, client.get("churn", c).unwrap())
            })
        })
        .collect();
    let lives = 40u32;
    for life in 1..=lives {
        admin.ns_create(&ns, &NamespaceSpec::default()).unwrap();
        admin
            .put("churn", c, format!("life {life}").as_bytes())
            .unwrap();
        if life < lives {
            admin.ns_drop(&ns).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        let (reads, last) = reader.join().unwrap();
        assert!(reads > 0);
        assert_eq!(last, Some(format!("life {lives}").into_bytes()));
    }
}
