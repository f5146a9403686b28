//! The loader, the safe layer and the fake CANN's rules, through the same libloading path that
//! production uses (the fake CANN's directory given explicitly).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use eplb_ascend_sys::fake::{self, FakeCann};
use eplb_ascend_sys::types::{HcclDataType, HcclResult, HcclSendRecvItem, HcclSendRecvType};
use eplb_ascend_sys::{
    Cann, Comm, Error, ErrorKind, Location, P2p, P2pKind, Region, RootInfo, Runtime, Search,
    Workspace,
};

const TIMEOUT: Duration = Duration::from_millis(300);

fn fake_dir() -> &'static Path {
    fake::dir().expect("built with the fake-cann feature")
}

fn setup() -> (Runtime, FakeCann) {
    let cann = Cann::load_dir(fake_dir()).unwrap();
    let ctl = FakeCann::open(fake_dir()).unwrap();
    ctl.set_timeout(TIMEOUT);
    (Runtime::init(cann).unwrap(), ctl)
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eplb-ascend-sys-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_directory_without_hccl_is_skipped_with_the_reason() {
    let dir = scratch_dir("acl-only");
    std::fs::copy(
        fake_dir().join("libascendcl.so"),
        dir.join("libascendcl.so"),
    )
    .unwrap();
    let err = Cann::load(&Search::dir(&dir)).unwrap_err();
    assert!(err.to_string().contains("libhccl.so not found"), "{err}");
    // A file that is not a library is reported with the dynamic linker's reason.
    std::fs::write(dir.join("libhccl.so"), b"not an ELF file").unwrap();
    let err = Cann::load(&Search::dir(&dir)).unwrap_err();
    assert!(err.to_string().contains("libhccl.so: "), "{err}");
}

#[test]
fn the_fake_loads_through_the_production_loader() {
    let cann = Cann::load_dir(fake_dir()).unwrap();
    assert!(matches!(cann.location(), Location::Dir { .. }));
    assert!(cann.hccl.HcclBatchSendRecv.is_some());
    assert!(cann.hccl.HcclGetCommAsyncError.is_some());
    assert!(cann.hccl.HcclGroupStart.is_some() && cann.hccl.HcclGroupEnd.is_some());
    assert!(cann.acl.aclrtSynchronizeStreamWithTimeout.is_some());
    assert!(cann.acl.aclGetRecentErrMsg.is_some());
    // Repeated initialisation is fine.
    Runtime::init(Arc::clone(&cann)).unwrap();
    Runtime::init(cann).unwrap();
    assert!(RootInfo::from_bytes(&[0; 12]).is_err());
}

#[test]
fn buffers_and_streams_are_freed_on_drop() {
    let (rt, ctl) = setup();
    let dev = 900;
    {
        let mut ws = Workspace::new(&rt, dev).unwrap();
        let a = ws.alloc(100).unwrap();
        let b = ws.alloc(4096).unwrap();
        ws.copy(Region::new(b, 0, 100), Region::new(a, 0, 100))
            .unwrap();
        assert_eq!(ctl.live_allocations(Some(dev)), 2);
        assert_eq!(ctl.live_handles(Some(dev)), 1);
        ws.free(a, Some(TIMEOUT)).unwrap();
        assert_eq!(ctl.live_allocations(Some(dev)), 1);
        assert!(ws.free(a, None).is_err(), "double free is refused");
    }
    assert_eq!(ctl.live_allocations(Some(dev)), 0);
    assert_eq!(ctl.live_handles(Some(dev)), 0);
}

#[test]
fn copies_round_trip_and_regions_are_checked() {
    let (rt, _ctl) = setup();
    let mut ws = Workspace::new(&rt, 901).unwrap();
    let a = ws.alloc(256).unwrap();
    let b = ws.alloc(256).unwrap();
    let data: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
    ws.write(Region::new(a, 10, 200), &data).unwrap();
    ws.copy(Region::new(b, 50, 200), Region::new(a, 10, 200))
        .unwrap();
    ws.synchronize(Some(TIMEOUT)).unwrap();
    let mut out = vec![0u8; 200];
    ws.read(Region::new(b, 50, 200), &mut out).unwrap();
    assert_eq!(out, data);
    for bad in [
        ws.write(Region::new(a, 100, 200), &data),
        ws.copy(Region::new(a, 0, 100), Region::new(a, 50, 100)),
        ws.copy(Region::new(a, 0, 10), Region::new(b, 0, 20)),
        ws.read(Region::new(b, usize::MAX, 2), &mut [0; 2]),
    ] {
        assert!(matches!(bad, Err(Error::Invalid { .. })), "{bad:?}");
    }
    assert!(ws.alloc(0).is_err());
}

#[test]
fn the_fake_rejects_copies_of_the_wrong_kind() {
    let (rt, _ctl) = setup();
    let cann = Arc::clone(rt.cann());
    let mut ws = Workspace::new(&rt, 902).unwrap(); // binds device 902 on this thread
    let _ = ws.alloc(64).unwrap();
    let mut host = [0u8; 64];
    let other = [1u8; 64];
    // SAFETY: host to host copy between two live 64-byte arrays, declared as device to host:
    // the fake must refuse it without touching either.
    let code = unsafe {
        (cann.acl.aclrtMemcpy)(host.as_mut_ptr().cast(), 64, other.as_ptr().cast(), 64, 2)
    };
    assert_eq!(code, 100_000);
    assert_eq!(host, [0; 64]);
    // SAFETY: no arguments.
    let msg = unsafe { (cann.acl.aclGetRecentErrMsg.unwrap())() };
    assert!(!msg.is_null());
}

/// Sets up `n` ranks on threads (devices `base..`), each running `f(rank, ws, comm)`.
fn ranks<T: Send + 'static>(
    n: u32,
    base: i32,
    f: impl Fn(u32, &mut Workspace, &mut Comm) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let (rt, _ctl) = setup();
    let root = Arc::new(RootInfo::generate(&rt, base).unwrap());
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(n as usize));
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (rt, root, f, barrier) = (rt.clone(), root.clone(), f.clone(), barrier.clone());
            std::thread::spawn(move || {
                let dev = base + r as i32;
                let mut ws = Workspace::new(&rt, dev).unwrap();
                let mut comm = Comm::init_root_info(&rt, dev, n, r, &root).unwrap();
                barrier.wait();
                f(r, &mut ws, &mut comm)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn batch_send_recv_and_all_gather_move_bytes() {
    let out = ranks(4, 910, |r, ws, comm| {
        let send = ws.alloc(3 * 64).unwrap();
        let recv = ws.alloc(3 * 64).unwrap();
        let mut items = Vec::new();
        for (k, peer) in (0..4u32).filter(|&p| p != r).enumerate() {
            let bytes = vec![(r * 16 + peer) as u8; 64];
            ws.write(Region::new(send, k * 64, 64), &bytes).unwrap();
            items.push(P2p {
                kind: P2pKind::Send,
                peer,
                region: Region::new(send, k * 64, 64),
                dtype: HcclDataType::UINT8,
            });
            items.push(P2p {
                kind: P2pKind::Recv,
                peer,
                region: Region::new(recv, k * 64, 64),
                dtype: HcclDataType::UINT8,
            });
        }
        ws.batch_send_recv(comm, &items).unwrap();
        ws.synchronize(Some(TIMEOUT)).unwrap();
        let mut got = vec![0u8; 3 * 64];
        ws.read(Region::new(recv, 0, 3 * 64), &mut got).unwrap();
        let g = ws.alloc(8).unwrap();
        let all = ws.alloc(32).unwrap();
        ws.write(Region::new(g, 0, 8), &u64::from(r + 100).to_le_bytes())
            .unwrap();
        ws.all_gather(
            comm,
            Region::new(g, 0, 8),
            Region::new(all, 0, 32),
            HcclDataType::UINT64,
        )
        .unwrap();
        ws.synchronize(Some(TIMEOUT)).unwrap();
        let mut gathered = vec![0u8; 32];
        ws.read(Region::new(all, 0, 32), &mut gathered).unwrap();
        (got, gathered)
    });
    for (r, (got, gathered)) in out.iter().enumerate() {
        let peers: Vec<usize> = (0..4).filter(|&p| p != r).collect();
        for (k, p) in peers.iter().enumerate() {
            assert!(
                got[k * 64..(k + 1) * 64]
                    .iter()
                    .all(|&b| b as usize == p * 16 + r)
            );
        }
        let vals: Vec<u64> = gathered
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, vec![100, 101, 102, 103]);
    }
}

#[test]
fn the_fake_enforces_the_batch_rules() {
    let out = ranks(2, 920, |r, ws, comm| {
        let buf = ws.alloc(256).unwrap();
        let mut results = Vec::new();
        if r == 0 {
            // Two send buffers for one peer in one call: refused by the safe layer...
            let two = [P2p {
                kind: P2pKind::Send,
                peer: 1,
                region: Region::new(buf, 0, 64),
                dtype: HcclDataType::UINT8,
            }; 2];
            results.push(format!(
                "{:?}",
                ws.batch_send_recv(comm, &two).err().map(|e| e.kind())
            ));
            // ...and by the fake itself, called raw.
            let cann = Arc::clone(ws.runtime().cann());
            results.push(format!("{:?}", raw_double_send(&cann, ws, comm)));
            // A peer out of range.
            let bad = [P2p {
                kind: P2pKind::Send,
                peer: 7,
                region: Region::new(buf, 0, 64),
                dtype: HcclDataType::UINT8,
            }];
            results.push(format!(
                "{:?}",
                ws.batch_send_recv(comm, &bad).err().map(|e| e.kind())
            ));
            // Count mismatch: send 64 bytes, the peer expects 32.
            let send = [P2p {
                kind: P2pKind::Send,
                peer: 1,
                region: Region::new(buf, 0, 64),
                dtype: HcclDataType::UINT8,
            }];
            ws.batch_send_recv(comm, &send).unwrap();
            results.push(format!("{:?}", ws.synchronize(Some(TIMEOUT)).is_ok()));
        } else {
            let recv = [P2p {
                kind: P2pKind::Recv,
                peer: 0,
                region: Region::new(buf, 0, 32),
                dtype: HcclDataType::UINT8,
            }];
            ws.batch_send_recv(comm, &recv).unwrap();
            let e = ws.synchronize(Some(TIMEOUT)).unwrap_err();
            results.push(format!("{:?}", e.kind()));
            results.push(format!("{:?}", comm.async_error().map(|e| e.code())));
        }
        results
    });
    assert_eq!(
        out[0],
        vec![
            "Some(InvalidInput)".to_string(),
            "HcclResult(1)".into(),
            "Some(InvalidInput)".into(),
            "true".into()
        ]
    );
    assert_eq!(out[1], vec!["Internal".to_string(), "Some(1)".into()]);
}

/// `HcclBatchSendRecv` with two send items for peer 1, bypassing the safe layer.
fn raw_double_send(cann: &Cann, ws: &Workspace, comm: &Comm) -> HcclResult {
    let item = HcclSendRecvItem {
        send_recv_type: HcclSendRecvType::SEND,
        buf: std::ptr::null_mut(),
        count: 0,
        data_type: HcclDataType::UINT8,
        remote_rank: 1,
    };
    let mut items = [item, item];
    let f = cann.hccl.HcclBatchSendRecv.unwrap();
    // SAFETY: two well-formed items with no elements (no memory is touched), a live
    // communicator and stream owned by the caller.
    unsafe { f(items.as_mut_ptr(), 2, comm.as_raw(), ws.as_raw_stream()) }
}

#[test]
fn a_receive_without_a_send_times_out() {
    let out = ranks(2, 930, |r, ws, comm| {
        if r == 0 {
            return None;
        }
        let buf = ws.alloc(64).unwrap();
        let t0 = Instant::now();
        let recv = [P2p {
            kind: P2pKind::Recv,
            peer: 0,
            region: Region::new(buf, 0, 64),
            dtype: HcclDataType::UINT8,
        }];
        ws.batch_send_recv(comm, &recv).unwrap();
        let e = ws.synchronize(Some(TIMEOUT)).unwrap_err();
        Some((e.kind(), comm.async_error().map(|e| e.kind()), t0.elapsed()))
    });
    let (kind, async_kind, took) = out[1].unwrap();
    assert_eq!(kind, ErrorKind::Timeout);
    assert_eq!(async_kind, Some(ErrorKind::Timeout));
    assert!(took >= TIMEOUT && took < TIMEOUT * 10, "{took:?}");
}

#[test]
fn injected_failures_carry_the_code_and_message() {
    let (rt, ctl) = setup();
    let dev = 940;
    let mut ws = Workspace::new(&rt, dev).unwrap();
    ctl.fail("aclrtMalloc", Some(dev), 2, 1, 207_001).unwrap();
    ws.alloc(64).unwrap();
    let e = ws.alloc(64).unwrap_err();
    assert_eq!(e.code(), 207_001);
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.to_string().contains("injected failure"), "{e}");
    ws.alloc(64).unwrap();
    ctl.hang("aclrtSynchronizeStreamWithTimeout", Some(dev), 1, 1)
        .unwrap();
    let e = ws.synchronize(Some(TIMEOUT)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    ws.synchronize(Some(TIMEOUT)).unwrap();
    ctl.clear(Some(dev));
    assert!(ctl.fail("x", None, 0, 1, 1).is_err(), "nth is 1-based");
}

#[test]
fn joining_needs_every_rank_and_a_real_root_info() {
    let (rt, _ctl) = setup();
    let root = RootInfo::generate(&rt, 950).unwrap();
    assert_eq!(root.as_bytes().len(), 4108);
    let again = RootInfo::from_bytes(root.as_bytes()).unwrap();
    assert_eq!(again, root);
    // Rank 0 of 2 alone: the other never comes.
    let t0 = Instant::now();
    let e = Comm::init_root_info(&rt, 950, 2, 0, &root).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(t0.elapsed() >= TIMEOUT);
    // Bytes that HcclGetRootInfo did not make.
    let junk = RootInfo::from_bytes(&[7; 4108]).unwrap();
    let e = Comm::init_root_info(&rt, 951, 1, 0, &junk).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(
        Comm::init_root_info(&rt, 951, 2, 2, &root).is_err(),
        "rank out of range"
    );
    // A world of one works.
    let solo = RootInfo::generate(&rt, 952).unwrap();
    let comm = Comm::init_root_info(&rt, 952, 1, 0, &solo).unwrap();
    assert_eq!((comm.rank(), comm.ranks()), (0, 1));
}
