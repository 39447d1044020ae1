//! The TCP transport over real loopback sockets: strangers are refused while real peers get
//! through, striped messages arrive intact, and bad or missing data become typed errors.

use railcc_core::auth::{prove_client, Secret};
use railcc_core::call::CollKind;
use railcc_core::net::{ConnIdent, MsgTag, NetRecvComm, NetSendComm, NetTransport};
use railcc_core::{DataType, ErrorKind};
use railcc_transport_tcp::{TcpSettings, TcpTransport};
use std::io::Write;
use std::time::{Duration, Instant};

fn settings(nstreams: usize) -> TcpSettings {
    TcpSettings {
        nstreams,
        stripe_min_bytes: 4096,
        socket_buffer_bytes: 1 << 20,
        max_message_bytes: 1 << 30,
        rail_failover: true,
        rail_timeout: Duration::from_secs(3),
        measure_rails: true,
    }
}

fn tag(count: u64) -> MsgTag {
    MsgTag::new(1, CollKind::AllReduce, DataType::U8, None, None, count)
}

/// A connected pair: (sender side, receiver side), after refusing two strangers.
fn pair(nstreams: usize) -> (Box<dyn NetSendComm>, Box<dyn NetRecvComm>) {
    let secret = Secret([3; 16]);
    let t = TcpTransport::new(
        "lo".into(),
        "127.0.0.1".parse().unwrap(),
        secret,
        settings(nstreams),
    );
    let mut listener = t.listen(0).unwrap();
    let handle = listener.handle();
    let addr: std::net::SocketAddr = std::str::from_utf8(&handle.0).unwrap().parse().unwrap();
    // Stranger 1: wrong secret. Stranger 2: garbage.
    let s1 = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        prove_client(
            &mut s,
            &Secret([4; 16]),
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap_err()
        .kind
    });
    let mut s2 = std::net::TcpStream::connect(addr).unwrap();
    s2.write_all(&[0xffu8; 100]).unwrap();
    let h = std::thread::spawn(move || {
        t.connect(
            0,
            &handle,
            ConnIdent {
                rank: 5,
                channel: 0,
            },
            Instant::now() + Duration::from_secs(10),
        )
        .unwrap()
    });
    let (who, recv) = loop {
        if let Some(c) = listener
            .accept(Instant::now() + Duration::from_secs(10))
            .unwrap()
        {
            break c;
        }
    };
    assert_eq!(who.rank, 5);
    // Keep serving the listener until the stranger's handshake ran (its thread may connect
    // after rank 5 did; a real job's accept loop never stops).
    let until = Instant::now() + Duration::from_secs(10);
    while !s1.is_finished() && Instant::now() < until {
        let _ = listener.accept(Instant::now() + Duration::from_millis(20));
    }
    assert_eq!(s1.join().unwrap(), ErrorKind::Unauthorized);
    (h.join().unwrap(), recv)
}

fn wait_both(
    s: &mut dyn NetSendComm,
    sr: railcc_core::net::ReqId,
    r: &mut dyn NetRecvComm,
    rr: railcc_core::net::ReqId,
) -> railcc_core::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut sd, mut rd) = (false, false);
    while !(sd && rd) {
        if !sd {
            sd = s.test(sr)?.is_some();
        }
        if !rd {
            rd = r.test(rr)?.is_some();
        }
        assert!(Instant::now() < deadline, "transfer hung");
    }
    Ok(())
}

#[test]
fn striped_messages_arrive_intact_and_strangers_are_refused() {
    let (mut s, mut r) = pair(4);
    for len in [0usize, 1, 4095, 4096, 100_000, 3 << 20] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut got = vec![0u8; len];
        // SAFETY: both buffers outlive the requests, which complete inside wait_both.
        let (sr, rr) = unsafe {
            (
                s.isend(data.as_ptr(), len, tag(len as u64), None).unwrap(),
                r.irecv(got.as_mut_ptr(), len, tag(len as u64), None)
                    .unwrap(),
            )
        };
        wait_both(s.as_mut(), sr, r.as_mut(), rr).unwrap();
        assert_eq!(got, data, "length {len}");
    }
}

/// Sends `data` and receives into `got`; an error may surface at post time or while waiting.
///
/// # Safety
/// Both buffers must outlive the requests (they do: this waits for completion or error).
unsafe fn exchange(
    s: &mut dyn NetSendComm,
    data: &[u8],
    r: &mut dyn NetRecvComm,
    got: &mut [u8],
    st: MsgTag,
    rt: MsgTag,
) -> railcc_core::Result<()> {
    let sr = s.isend(data.as_ptr(), data.len(), st, None)?;
    let rr = r.irecv(got.as_mut_ptr(), got.len(), rt, None)?;
    wait_both(s, sr, r, rr)
}

#[test]
fn size_and_tag_mismatches_are_named() {
    let (mut s, mut r) = pair(1);
    let data = vec![1u8; 64];
    let mut got = vec![0u8; 32];
    // SAFETY: buffers outlive the requests.
    let e =
        unsafe { exchange(s.as_mut(), &data, r.as_mut(), &mut got, tag(64), tag(64)) }.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Mismatch);
    assert!(e.message.contains("peer sent 64 bytes"), "{e}");

    let (mut s, mut r) = pair(1);
    let mut got = vec![0u8; 64];
    let mut other = tag(64);
    other.dtype = DataType::F32 as u8;
    // SAFETY: buffers outlive the requests.
    let e =
        unsafe { exchange(s.as_mut(), &data, r.as_mut(), &mut got, tag(64), other) }.unwrap_err();
    assert!(e.message.contains("dtype differs"), "{e}");
}

#[test]
fn a_peer_that_goes_away_is_peer_closed_not_a_hang() {
    let (s, mut r) = pair(2);
    let mut got = vec![0u8; 1 << 20];
    // SAFETY: `got` outlives the request.
    let rr = unsafe {
        r.irecv(got.as_mut_ptr(), got.len(), tag(1 << 20), None)
            .unwrap()
    };
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match r.test(rr) {
            Err(e) => break e,
            Ok(Some(_)) => panic!("completed without data"),
            Ok(None) => assert!(Instant::now() < deadline, "hang after peer closed"),
        }
    };
    assert_eq!(e.kind, ErrorKind::PeerClosed, "{e}");
}

#[test]
fn hostile_header_is_a_protocol_error_without_allocation() {
    // A peer that knows the secret but sends a header announcing 2^62 bytes.
    let secret = Secret([3; 16]);
    let t = TcpTransport::new(
        "lo".into(),
        "127.0.0.1".parse().unwrap(),
        secret,
        settings(1),
    );
    let mut listener = t.listen(0).unwrap();
    let addr: std::net::SocketAddr = std::str::from_utf8(&listener.handle().0)
        .unwrap()
        .parse()
        .unwrap();
    let h = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        prove_client(&mut s, &secret, Instant::now() + Duration::from_secs(5)).unwrap();
        let mut hello = Vec::new();
        hello.extend_from_slice(&0x4843_5452u32.to_le_bytes());
        hello.extend_from_slice(&1u32.to_le_bytes());
        hello.extend_from_slice(&0u32.to_le_bytes());
        hello.extend_from_slice(&0u16.to_le_bytes());
        hello.extend_from_slice(&1u16.to_le_bytes());
        hello.extend_from_slice(&1u32.to_le_bytes()); // weight
        hello.extend_from_slice(&0u32.to_le_bytes()); // flags
        s.write_all(&hello).unwrap();
        let hdr = railcc_transport_tcp::frame::Header {
            part: 0,
            nparts: 1,
            seq: 0,
            tag: tag(8),
            total: 1 << 62,
            off: 0,
            len: 1 << 62,
            epoch: 0,
            kind: railcc_transport_tcp::frame::Kind::Data,
        };
        s.write_all(&hdr.encode()).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let (_, mut r) = loop {
        if let Some(c) = listener
            .accept(Instant::now() + Duration::from_secs(10))
            .unwrap()
        {
            break c;
        }
    };
    let mut got = vec![0u8; 8];
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: `got` outlives the request.
    let e = match unsafe { r.irecv(got.as_mut_ptr(), 8, tag(8), None) } {
        Err(e) => e,
        Ok(rr) => loop {
            match r.test(rr) {
                Err(e) => break e,
                Ok(Some(_)) => panic!("the receive completed on a hostile header"),
                Ok(None) => assert!(Instant::now() < deadline, "hang"),
            }
        },
    };
    assert_eq!(e.kind, ErrorKind::Protocol, "{e}");
    h.join().unwrap();
}
