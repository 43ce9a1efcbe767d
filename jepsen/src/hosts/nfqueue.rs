//! Netem in userspace, for kernels without the netem qdisc: a netfilter queue (NFQUEUE) inside
//! a node's network namespace, served by a thread of the harness.
//!
//! An iptables rule in the namespace ([`super::net::queue_rule`]) hands every packet leaving
//! the node's interface to queue [`super::net::QUEUE_NUM`]. The [`Impairer`]'s thread enters
//! the namespace (`setns`), opens a netfilter netlink socket there, binds the queue (metadata
//! only: the packets stay in the kernel, the thread sees their ids) and gives each packet its
//! fate by [`Netem::fate`]: a drop verdict (loss), an accept verdict at once (reordering), or
//! an accept verdict after its delay with jitter. Verdicts may come in any order, so packets
//! whose delays cross overtake each other, as with netem.
//!
//! The queue is bound fail-open (a full queue passes packets instead of dropping them) and the
//! rule has `--queue-bypass` (no listener: packets pass), so a stopped or dead thread never
//! blackholes a node. Stopping passes every packet still held.
//!
//! The netlink messages are built and parsed here directly (nfnetlink_queue: the `CONFIG`
//! message binds, `PACKET` messages announce packets, `VERDICT` messages decide them).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rand::{Rng as _, SeedableRng as _};

use super::Netem;

const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_CFG_CMD_UNBIND: u8 = 2;
const NFQNL_COPY_META: u8 = 1;
const NFQA_CFG_F_FAIL_OPEN: u32 = 1;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
/// Attribute type bits that are flags, not the type.
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLMSG_HDRLEN: usize = 16;
/// Most packets the kernel holds for the queue (the rest pass: fail-open).
const QUEUE_MAXLEN: u32 = 20_000;
/// How often the thread looks at its stop flag when nothing else wakes it.
const TICK: Duration = Duration::from_millis(20);
/// How long binding may wait for the kernel's answer.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// What one queue did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Packets seen.
    pub packets: u64,
    /// Dropped (loss).
    pub dropped: u64,
    /// Passed at once (reordering, or a delay of zero).
    pub at_once: u64,
    /// Passed after a delay.
    pub delayed: u64,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} packets: {} dropped, {} delayed, {} passed at once",
            self.packets, self.dropped, self.delayed, self.at_once
        )
    }
}

/// A running userspace impairment of one namespace. Stops on [`Impairer::stop`] or drop.
pub struct Impairer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Stats>>,
}

impl Impairer {
    /// Starts impairing packets queued to `queue` in the namespace named by the file `ns`
    /// (`/run/netns/NAME`, `/proc/PID/ns/net`). Returns once the queue is bound; packets only
    /// arrive once the queue rule is in place.
    pub fn start(ns: &Path, queue: u16, netem: Netem) -> anyhow::Result<Impairer> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, is_ready) = mpsc::channel();
        let ns: PathBuf = ns.to_path_buf();
        let thread = std::thread::Builder::new()
            .name(format!("impair-q{queue}"))
            .spawn({
                let stop = Arc::clone(&stop);
                move || match Queue::open(&ns, queue) {
                    Ok(q) => {
                        let _ = ready.send(Ok(()));
                        q.serve(netem, &stop)
                    }
                    Err(err) => {
                        let _ = ready.send(Err(err));
                        Stats::default()
                    }
                }
            })
            .context("cannot start the impairment thread")?;
        match is_ready.recv() {
            Ok(Ok(())) => Ok(Impairer {
                stop,
                thread: Some(thread),
            }),
            Ok(Err(err)) => {
                let _ = thread.join();
                Err(err)
            }
            Err(_) => {
                let _ = thread.join();
                bail!("the impairment thread ended before binding its queue")
            }
        }
    }

    /// Stops: passes every packet still held, unbinds the queue. Says what it did.
    pub fn stop(mut self) -> String {
        self.halt()
            .map_or_else(|| "impairment thread failed".to_string(), |s| s.to_string())
    }

    fn halt(&mut self) -> Option<Stats> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for Impairer {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A netfilter netlink socket bound to one queue.
struct Queue {
    fd: OwnedFd,
    queue: u16,
    seq: u32,
}

/// Enters the network namespace named by the file `ns`, for this thread only.
fn enter_namespace(ns: &Path) -> anyhow::Result<()> {
    let file = File::open(ns).with_context(|| format!("cannot open {}", ns.display()))?;
    // SAFETY: setns on a valid descriptor only changes this thread's namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!(
            "cannot enter the network namespace {}: {}",
            ns.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Sets an `int` socket option of `fd`, ignoring a failure.
fn set_int_option(fd: libc::c_int, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: setsockopt with a pointer to a live int of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

fn kernel_addr() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr
}

impl Queue {
    fn open(ns: &Path, queue: u16) -> anyhow::Result<Queue> {
        enter_namespace(ns)?;
        // SAFETY: plain socket(2) call; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_NETFILTER,
            )
        };
        if raw < 0 {
            bail!(
                "cannot open a netfilter netlink socket: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Failures only make the socket less tolerant of bursts.
        set_int_option(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20);
        set_int_option(raw, libc::SOL_NETLINK, libc::NETLINK_NO_ENOBUFS, 1);
        let addr = kernel_addr();
        // SAFETY: binds to a valid sockaddr_nl of the size given.
        let bound = unsafe {
            libc::bind(
                raw,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if bound != 0 {
            bail!(
                "cannot bind the netlink socket: {}",
                std::io::Error::last_os_error()
            );
        }
        let mut q = Queue { fd, queue, seq: 0 };
        q.configure(&[(NFQA_CFG_CMD, config_cmd(NFQNL_CFG_CMD_BIND).to_vec())])
            .with_context(|| {
                format!("cannot bind netfilter queue {queue} (is another program using it?)")
            })?;
        let mut params = 0xffff_u32.to_be_bytes().to_vec();
        params.push(NFQNL_COPY_META);
        q.configure(&[
            (NFQA_CFG_PARAMS, params),
            (NFQA_CFG_QUEUE_MAXLEN, QUEUE_MAXLEN.to_be_bytes().to_vec()),
            (NFQA_CFG_MASK, NFQA_CFG_F_FAIL_OPEN.to_be_bytes().to_vec()),
            (NFQA_CFG_FLAGS, NFQA_CFG_F_FAIL_OPEN.to_be_bytes().to_vec()),
        ])
        .with_context(|| format!("cannot configure netfilter queue {queue}"))?;
        Ok(q)
    }

    /// Sends one netlink message to the kernel.
    fn send(&self, msg: &[u8]) -> std::io::Result<()> {
        let addr = kernel_addr();
        // SAFETY: sends `msg` (a live buffer of its length) to a valid sockaddr_nl.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one datagram into `buf` without blocking; `Ok(0)` when there is none.
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        // SAFETY: receives into a live buffer of its length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            return match err.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(0),
                _ => Err(err),
            };
        }
        Ok(n as usize)
    }

    /// Waits until the socket is readable or `timeout` passes.
    fn wait(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: polls one valid pollfd.
        unsafe {
            libc::poll(&mut pfd, 1, ms);
        }
    }

    /// Sends a config message and waits for the kernel's acknowledgement.
    fn configure(&mut self, attrs: &[(u16, Vec<u8>)]) -> anyhow::Result<()> {
        self.seq += 1;
        let seq = self.seq;
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
        let msg = message(NFQNL_MSG_CONFIG, flags, seq, self.queue, attrs);
        self.send(&msg)?;
        let deadline = Instant::now() + ACK_TIMEOUT;
        let mut buf = vec![0u8; 8192];
        while Instant::now() < deadline {
            self.wait(TICK);
            let n = self.recv(&mut buf)?;
            for (ty, msg_seq, payload) in messages(&buf[..n]) {
                if ty == libc::NLMSG_ERROR as u16 && msg_seq == seq {
                    let code = payload
                        .get(..4)
                        .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                    if code == 0 {
                        return Ok(());
                    }
                    return Err(std::io::Error::from_raw_os_error(-code).into());
                }
            }
        }
        bail!("no answer from the kernel within {ACK_TIMEOUT:?}")
    }

    fn verdict(&self, id: u32, verdict: u32) {
        let mut hdr = verdict.to_be_bytes().to_vec();
        hdr.extend_from_slice(&id.to_be_bytes());
        let msg = message(
            NFQNL_MSG_VERDICT,
            libc::NLM_F_REQUEST as u16,
            0,
            self.queue,
            &[(NFQA_VERDICT_HDR, hdr)],
        );
        // A verdict that cannot be sent leaves the packet queued until the queue is unbound
        // (then it is dropped): a lost packet, which TCP retransmits.
        let _ = self.send(&msg);
    }

    /// Serves the queue until `stop`; then passes what it holds and unbinds.
    fn serve(self, netem: Netem, stop: &AtomicBool) -> Stats {
        let mut rng = rand::rngs::StdRng::from_entropy();
        let mut stats = Stats::default();
        let mut held: BinaryHeap<Reverse<(Instant, u32)>> = BinaryHeap::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut ids = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            while let Some(&Reverse((due, id))) = held.peek() {
                if due > now {
                    break;
                }
                held.pop();
                self.verdict(id, NF_ACCEPT);
            }
            let timeout = held
                .peek()
                .map_or(TICK, |Reverse((due, _))| due.saturating_duration_since(now))
                .min(TICK);
            self.wait(timeout);
            loop {
                let n = match self.recv(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    // ENOBUFS and the like: some announcements were lost; those packets stay
                    // queued until the unbind drops them (TCP retransmits).
                    Err(_) => break,
                };
                ids.clear();
                packet_ids(&buf[..n], &mut ids);
                let now = Instant::now();
                for &id in &ids {
                    stats.packets += 1;
                    match netem.fate(|| rng.gen::<f64>()) {
                        None => {
                            stats.dropped += 1;
                            self.verdict(id, NF_DROP);
                        }
                        Some(delay) if delay.is_zero() => {
                            stats.at_once += 1;
                            self.verdict(id, NF_ACCEPT);
                        }
                        Some(delay) => {
                            stats.delayed += 1;
                            held.push(Reverse((now + delay, id)));
                        }
                    }
                }
            }
        }
        while let Some(Reverse((_, id))) = held.pop() {
            self.verdict(id, NF_ACCEPT);
        }
        let unbind = message(
            NFQNL_MSG_CONFIG,
            libc::NLM_F_REQUEST as u16,
            0,
            self.queue,
            &[(NFQA_CFG_CMD, config_cmd(NFQNL_CFG_CMD_UNBIND).to_vec())],
        );
        let _ = self.send(&unbind);
        stats
    }
}

/// The `nfqnl_msg_config_cmd` payload: command, padding, protocol family (unused since
/// Linux 3.8).
fn config_cmd(cmd: u8) -> [u8; 4] {
    [cmd, 0, 0, 0]
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// One nfnetlink_queue message: netlink header, nfgenmsg (family unspecified, version 0,
/// queue number big-endian), attributes (each padded to 4 bytes).
fn message(kind: u16, flags: u16, seq: u32, queue: u16, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![libc::AF_UNSPEC as u8, 0];
    body.extend_from_slice(&queue.to_be_bytes());
    for (ty, payload) in attrs {
        let len = 4 + payload.len();
        body.extend_from_slice(&(len as u16).to_ne_bytes());
        body.extend_from_slice(&ty.to_ne_bytes());
        body.extend_from_slice(payload);
        body.resize(align4(body.len()), 0);
    }
    let total = NLMSG_HDRLEN + body.len();
    let mut msg = Vec::with_capacity(total);
    msg.extend_from_slice(&(total as u32).to_ne_bytes());
    msg.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | kind).to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// The netlink messages in a datagram: `(type, seq, payload)`. Stops at the first malformed
/// one.
fn messages(buf: &[u8]) -> Vec<(u16, u32, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let h = &buf[off..off + NLMSG_HDRLEN];
        let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            break;
        }
        let ty = u16::from_ne_bytes([h[4], h[5]]);
        let seq = u32::from_ne_bytes([h[8], h[9], h[10], h[11]]);
        out.push((ty, seq, &buf[off + NLMSG_HDRLEN..off + len]));
        off += align4(len);
    }
    out
}

/// The packet ids of the `PACKET` messages in a datagram, appended to `ids`.
fn packet_ids(buf: &[u8], ids: &mut Vec<u32>) {
    let packet = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET;
    for (ty, _, payload) in messages(buf) {
        if ty != packet || payload.len() < 4 {
            continue;
        }
        let attrs = &payload[4..];
        let mut off = 0;
        while off + 4 <= attrs.len() {
            let len = u16::from_ne_bytes([attrs[off], attrs[off + 1]]) as usize;
            let ty = u16::from_ne_bytes([attrs[off + 2], attrs[off + 3]]) & NLA_TYPE_MASK;
            if len < 4 || off + len > attrs.len() {
                break;
            }
            let value = &attrs[off + 4..off + len];
            if ty == NFQA_PACKET_HDR && value.len() >= 4 {
                ids.push(u32::from_be_bytes([value[0], value[1], value[2], value[3]]));
            }
            off += align4(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_laid_out_as_the_kernel_expects() {
        let mut hdr = NF_ACCEPT.to_be_bytes().to_vec();
        hdr.extend_from_slice(&0x0102_0304u32.to_be_bytes());
        let msg = message(NFQNL_MSG_VERDICT, 1, 9, 7, &[(NFQA_VERDICT_HDR, hdr)]);
        // 16 header + 4 nfgenmsg + 4 attribute header + 8 payload.
        assert_eq!(msg.len(), 32);
        assert_eq!(u32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]), 32);
        assert_eq!(u16::from_ne_bytes([msg[4], msg[5]]), (3 << 8) | 1);
        assert_eq!(&msg[18..20], &7u16.to_be_bytes());
        assert_eq!(u16::from_ne_bytes([msg[20], msg[21]]), 12);
        assert_eq!(&msg[24..28], &[0, 0, 0, 1]);
        assert_eq!(&msg[28..32], &[1, 2, 3, 4]);
        // Attribute payloads are padded to 4 bytes.
        let params = message(NFQNL_MSG_CONFIG, 1, 1, 7, &[(NFQA_CFG_PARAMS, vec![0; 5])]);
        assert_eq!(params.len(), 16 + 4 + 12);
    }

    #[test]
    fn packet_ids_come_out_of_packet_messages_only() {
        // A PACKET message: nfqnl_msg_packet_hdr (id, hw protocol, hook) and another attribute.
        let mut hdr = 77u32.to_be_bytes().to_vec();
        hdr.extend_from_slice(&[8, 0, 3]);
        let packet = {
            let mut m = message(
                NFQNL_MSG_PACKET,
                0,
                0,
                7,
                &[(2, vec![0; 4]), (NFQA_PACKET_HDR | 0x4000, hdr.clone())],
            );
            let mut second = message(
                NFQNL_MSG_PACKET,
                0,
                0,
                7,
                &[(NFQA_PACKET_HDR, {
                    let mut h = 78u32.to_be_bytes().to_vec();
                    h.extend_from_slice(&[8, 0, 3]);
                    h
                })],
            );
            m.append(&mut second);
            m
        };
        let config = message(NFQNL_MSG_CONFIG, 0, 0, 7, &[(NFQA_PACKET_HDR, hdr)]);
        let mut datagram = config;
        datagram.extend_from_slice(&packet);
        let mut ids = Vec::new();
        packet_ids(&datagram, &mut ids);
        assert_eq!(ids, vec![77, 78]);
        // A truncated datagram yields what is whole and nothing else.
        let mut ids = Vec::new();
        packet_ids(&packet[..packet.len() - 3], &mut ids);
        assert_eq!(ids, vec![77]);
    }
}
