//! The XDP program that steers chimed's UDP to its AF_XDP sockets, assembled here in Rust, and the
//! few `bpf(2)` calls that load and attach it.
//!
//! The program is small enough to write as instructions: it reads the clock, checks that a frame is
//! plain Ethernet + IPv4 (no options, not a fragment) or IPv6 (no extension header) + UDP to one of
//! the served addresses and ports, and if so writes the clock reading into the frame's metadata and
//! redirects it to the AF_XDP socket of its receive queue. Everything else (ARP, neighbour
//! discovery, ICMP, TCP, other ports, VLAN-tagged frames, fragments, IP options) is passed to the
//! kernel untouched. Assembling it here means no BPF toolchain (clang, bpf-linker) at build time
//! and no object file in the repository; the instructions are checked by the kernel's verifier at
//! load, and the tests load it.
//!
//! The program is attached with a BPF link (`BPF_LINK_CREATE`), not the older netlink call: the
//! link belongs to a file descriptor, so the kernel detaches the program when chimed exits however
//! it exits, `kill -9` included, and nothing is left on the interface.

use std::{
    ffi::CStr,
    io,
    mem::size_of,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    ptr,
};

use crate::asm::*;
use crate::sys::cvt;

/// What the program writes ahead of each frame it redirects (XDP metadata, read back by the
/// worker at the frame's address minus [`META_LEN`]): the receive time on `CLOCK_MONOTONIC` in
/// nanoseconds, then [`META_MAGIC`].
pub(crate) const META_LEN: usize = 16;
/// Marks metadata as written by this program for this frame; the worker clears it after reading,
/// so that a frame whose metadata was not copied cannot pass off a stale time as its own.
pub(crate) const META_MAGIC: u64 = 0x6368_696d_6578_6470; // "chimexdp"

/// A UDP destination the program steers to the sockets; `None` as the address matches any.
pub(crate) type Target = (Option<IpAddr>, u16);

/// The targets of socket addresses: an unspecified IP matches any of its family's.
pub(crate) fn targets(addrs: &[SocketAddr]) -> Vec<Target> {
    (addrs.iter())
        .map(|a| ((!a.ip().is_unspecified()).then(|| a.ip()), a.port()))
        .collect()
}

/// Where [`frame_to_target`] sends a frame to one target: to `v4` if it is IPv4, to `v6` if IPv6.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Route {
    pub(crate) target: Target,
    pub(crate) v4: Label,
    pub(crate) v6: Label,
}

/// The context (`struct xdp_md *`), kept from entry to the end.
pub(crate) const CTX: Reg = R6;
/// The `CLOCK_MONOTONIC` reading taken at entry, for the metadata of a frame for the sockets.
pub(crate) const RX_MONO: Reg = R9;
/// The frame's start and end while it is parsed: what a route's label starts with.
pub(crate) const DATA: Reg = R2;
pub(crate) const DATA_END: Reg = R3;

/// Ethernet (14) + IPv4 (20) + UDP (8): the shortest frame of interest.
pub(crate) const ETH_LEN: i16 = 14;
pub(crate) const IPV4_LEN: i16 = 20;
pub(crate) const IPV6_LEN: i16 = 40;
pub(crate) const UDP_LEN: i16 = 8;

/// Assembles the program for `targets`, redirecting through the XSKMAP whose file descriptor is
/// `map_fd`.
pub(crate) fn program(map_fd: RawFd, targets: &[Target]) -> Vec<Insn> {
    let mut a = Asm::default();
    let pass = a.label();
    let redirect = a.label();
    let routes: Vec<Route> = (targets.iter())
        .map(|&target| Route {
            target,
            v4: redirect,
            v6: redirect,
        })
        .collect();
    frame_to_target(&mut a, &routes, pass);
    a.place(redirect);
    to_socket(&mut a, map_fd, pass);
    a.place(pass);
    a.exit_with(XDP_PASS);
    a.finish()
}

/// The start of both programs (this one and `responder`'s): reads the clock into [`RX_MONO`],
/// and sends a frame that is plain Ethernet + IPv4 (no options, not a fragment) or IPv6 (no
/// extension header) + UDP to a route's target on to that route's label, with [`CTX`],
/// [`DATA`] and [`DATA_END`] set and at least the headers checked to be in the frame;
/// everything else to `pass`.
pub(crate) fn frame_to_target(a: &mut Asm, routes: &[Route], pass: Label) {
    let v4 = a.label();
    let v6 = a.label();
    a.mov(CTX, R1);
    a.call(FN_KTIME_GET_NS);
    a.mov(RX_MONO, R0);
    a.ldx(Size::W, DATA, CTX, MD_DATA);
    a.ldx(Size::W, DATA_END, CTX, MD_DATA_END);
    a.check_len(
        R4,
        DATA,
        DATA_END,
        i32::from(ETH_LEN + IPV4_LEN + UDP_LEN),
        pass,
    );
    a.ldx(Size::H, R4, DATA, 12);
    // The EtherType as a little-endian load of its network-order bytes.
    a.jmp32_k(JEQ, R4, i32::from(0x0800u16.swap_bytes()), v4);
    a.jmp32_k(JEQ, R4, i32::from(0x86ddu16.swap_bytes()), v6);
    a.ja(pass);

    a.place(v4);
    ipv4(a, routes, pass);
    a.place(v6);
    ipv6(a, routes, pass);
}

/// An IPv4 frame: UDP without options or fragments, to one of the routes' targets, jumps to its
/// route's `v4`; anything else to `pass`.
fn ipv4(a: &mut Asm, routes: &[Route], pass: Label) {
    a.ldx(Size::B, R4, DATA, 14);
    // Version 4 and a 20-byte header: frames with options go to the kernel.
    a.jmp32_k(JNE, R4, 0x45, pass);
    a.ldx(Size::H, R4, DATA, 20);
    // More-fragments and the fragment offset (0x3fff in network order): fragments go to the kernel.
    a.alu_k(AND, R4, i32::from(0x3fffu16.swap_bytes()));
    a.jmp32_k(JNE, R4, 0, pass);
    a.ldx(Size::B, R4, DATA, 23);
    a.jmp32_k(JNE, R4, i32::from(libc::IPPROTO_UDP as u8), pass);
    a.ldx(Size::W, R4, DATA, 30);
    a.ldx(Size::H, R5, DATA, 36);
    for route in routes {
        let (addr, port) = route.target;
        let ip = match addr {
            None => None,
            Some(IpAddr::V4(ip)) => Some(ip),
            Some(IpAddr::V6(_)) => continue,
        };
        let next = a.label();
        if let Some(ip) = ip {
            a.jmp32_k(JNE, R4, u32::from_ne_bytes(ip.octets()) as i32, next);
        }
        a.jmp32_k(JEQ, R5, i32::from(port.swap_bytes()), route.v4);
        a.place(next);
    }
    a.ja(pass);
}

/// An IPv6 frame: UDP with no extension header, to one of the routes' targets, jumps to its
/// route's `v6`; anything else to `pass`.
fn ipv6(a: &mut Asm, routes: &[Route], pass: Label) {
    a.check_len(
        R4,
        DATA,
        DATA_END,
        i32::from(ETH_LEN + IPV6_LEN + UDP_LEN),
        pass,
    );
    a.ldx(Size::B, R4, DATA, 14);
    a.alu_k(AND, R4, 0xf0);
    a.jmp32_k(JNE, R4, 0x60, pass);
    // Next header UDP: any extension header (fragments among them) goes to the kernel.
    a.ldx(Size::B, R4, DATA, 20);
    a.jmp32_k(JNE, R4, i32::from(libc::IPPROTO_UDP as u8), pass);
    a.ldx(Size::H, R5, DATA, 56);
    for route in routes {
        let (addr, port) = route.target;
        let ip = match addr {
            None => None,
            Some(IpAddr::V6(ip)) => Some(ip),
            Some(IpAddr::V4(_)) => continue,
        };
        let next = a.label();
        a.jmp32_k(JNE, R5, i32::from(port.swap_bytes()), next);
        if let Some(ip) = ip {
            for (i, word) in ip.octets().chunks_exact(4).enumerate() {
                let word = u32::from_ne_bytes(word.try_into().expect("4 bytes"));
                a.ldx(Size::W, R4, DATA, 38 + 4 * i as i16);
                a.jmp32_k(JNE, R4, word as i32, next);
            }
        }
        a.ja(route.v6);
        a.place(next);
    }
    a.ja(pass);
}

/// A frame for the sockets: the clock reading goes into its metadata, then it is redirected to
/// its receive queue's socket through the XSKMAP `map_fd` (to `pass` if there is no room).
pub(crate) fn to_socket(a: &mut Asm, map_fd: RawFd, pass: Label) {
    a.mov(R1, CTX);
    a.mov_imm(R2, -(META_LEN as i32));
    a.call(FN_XDP_ADJUST_META);
    // Without room for the metadata the frame goes to the kernel, whose socket answers it.
    a.jmp32_k(JNE, R0, 0, pass);
    a.ldx(Size::W, R2, CTX, MD_DATA_META);
    a.ldx(Size::W, R3, CTX, MD_DATA);
    a.check_len(R4, R2, R3, META_LEN as i32, pass);
    a.stx(Size::DW, R2, 0, RX_MONO);
    a.ld_imm64(R4, META_MAGIC);
    a.stx(Size::DW, R2, 8, R4);
    a.ld_map(R1, map_fd);
    a.ldx(Size::W, R2, CTX, MD_RX_QUEUE_INDEX);
    // The low bits of the flags are the action when the queue has no socket: the kernel's.
    a.mov_imm(R3, XDP_PASS);
    a.call(FN_REDIRECT_MAP);
    a.exit();
}

// bpf(2) commands and the types and flags used with them.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
const BPF_MAP_TYPE_LPM_TRIE: u32 = 11;
const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
/// `XDP_FLAGS_DRV_MODE`: the driver's own XDP hook, not the generic one after the stack has
/// built an skb (which would leave nothing to gain).
pub(crate) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// The leading fields of `union bpf_attr` for `BPF_MAP_CREATE`.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_MAP_UPDATE_ELEM`.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The leading fields of `union bpf_attr` for `BPF_PROG_LOAD`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The leading fields of `union bpf_attr` for `BPF_PROG_TEST_RUN`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
}

/// The leading fields of `union bpf_attr` for `BPF_LINK_CREATE`.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// Calls `bpf(cmd, attr, sizeof attr)`; returns the new file descriptor for the commands that
/// make one.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<RawFd> {
    // SAFETY: `attr` is a live, initialised `#[repr(C)]` prefix of `union bpf_attr` for `cmd`,
    // and the size passed is its own, so the kernel reads (and for some commands writes) only
    // its bytes; the kernel treats the union's fields beyond that size as zero. Pointers inside
    // it point at buffers the caller keeps alive across this call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            ptr::from_mut(attr),
            size_of::<T>() as libc::c_uint,
        )
    };
    // bpf returns a file descriptor or 0, or -1 with errno.
    cvt(i32::try_from(ret).unwrap_or(-1)).map(|fd| fd as RawFd)
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful bpf() call that creates a file descriptor,
    // so it is open and owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    // The kernel wants at most 15 bytes of [A-Za-z0-9_.] and a NUL.
    for (o, b) in out[..15].iter_mut().zip(name.bytes()) {
        *o = b;
    }
    out
}

/// Makes an XSKMAP with one entry per receive queue.
pub(crate) fn create_xskmap(queues: u32) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: queues,
        map_name: name16("chimed_xsks"),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Puts the AF_XDP socket `xsk` in `map` for receive queue `queue`.
pub(crate) fn set_xskmap(map: &OwnedFd, queue: u32, xsk: RawFd) -> io::Result<()> {
    update_elem(map, queue, &(xsk as u32))
}

/// Makes an array map of one entry of `value_size` bytes, all zero, named `name`.
pub(crate) fn create_array(name: &str, value_size: usize) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: value_size as u32,
        max_entries: 1,
        map_name: name16(name),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Makes an array map of `entries` entries of `value_size` bytes, all zero, named `name`.
pub(crate) fn create_table(name: &str, value_size: usize, entries: u32) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: value_size as u32,
        max_entries: entries,
        map_name: name16(name),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Makes an array of maps of one entry, empty, whose maps are like `inner` (an array map made by
/// [`create_array`] of the same value size): a program looks the map up, then its value.
pub(crate) fn create_map_of_one(name: &str, inner: &OwnedFd) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY_OF_MAPS,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        inner_map_fd: inner.as_raw_fd() as u32,
        map_name: name16(name),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Makes a longest-prefix-match trie of at most `entries` entries (at least one) whose keys are
/// `key_size` bytes (a `u32` prefix length in bits, then the data it counts) and whose values
/// `value_size`, named `name`. The kernel allocates its entries as they are added
/// (`BPF_F_NO_PREALLOC`, which it requires of a trie).
pub(crate) fn create_lpm_trie(
    name: &str,
    key_size: usize,
    value_size: usize,
    entries: u32,
) -> io::Result<OwnedFd> {
    const BPF_F_NO_PREALLOC: u32 = 1;
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_LPM_TRIE,
        key_size: key_size as u32,
        value_size: value_size as u32,
        max_entries: entries.max(1),
        map_flags: BPF_F_NO_PREALLOC,
        map_name: name16(name),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Makes a per-CPU array of `entries` counters (`u64`), all zero, named `name`.
pub(crate) fn create_percpu_counters(name: &str, entries: u32) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_PERCPU_ARRAY,
        key_size: 4,
        value_size: 8,
        max_entries: entries,
        map_name: name16(name),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// The sum over every CPU of counter `key` of a map made by [`create_percpu_counters`]; `cpus`
/// is [`possible_cpus`], the number of values the kernel copies out.
pub(crate) fn sum_percpu_counter(map: &OwnedFd, key: u32, cpus: usize) -> io::Result<u64> {
    let mut values = vec![0u64; cpus];
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: ptr::from_ref(&key) as u64,
        value: values.as_mut_ptr() as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)?;
    Ok(values.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
}

/// The CPUs the kernel may ever run (`/sys/devices/system/cpu/possible`, e.g. `0-3` or `0,2-5`):
/// a per-CPU map's lookup copies out one value for each.
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    cpus_in_list(text.trim()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/sys/devices/system/cpu/possible: {text:?} is not a CPU list"),
        )
    })
}

/// The number of CPUs in a kernel CPU list (`0-3,5`).
fn cpus_in_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let one = part.parse::<usize>().ok()?;
                (one, one)
            }
        };
        n += hi.checked_sub(lo)? + 1;
    }
    Some(n)
}

/// Writes `value` as `map`'s entry `key`. `V` must be the map's value type, `#[repr(C)]` and
/// without padding, so that every byte the kernel copies is initialised.
pub(crate) fn update_elem<V: Copy>(map: &OwnedFd, key: u32, value: &V) -> io::Result<()> {
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: ptr::from_ref(&key) as u64,
        value: ptr::from_ref(value) as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// Writes `value` under `key` in `map`, whatever the key's type: as [`update_elem`], with `K`
/// the map's key type under the same conditions.
pub(crate) fn update_keyed<K: Copy, V: Copy>(map: &OwnedFd, key: &K, value: &V) -> io::Result<()> {
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: ptr::from_ref(key) as u64,
        value: ptr::from_ref(value) as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// Removes `map`'s entry `key`; an entry already absent is no error. For an array of maps, the
/// slot is then empty, and the map it held is freed once no program can still be reading it.
pub(crate) fn delete_elem(map: &OwnedFd, key: u32) -> io::Result<()> {
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: ptr::from_ref(&key) as u64,
        ..Default::default()
    };
    match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other.map(drop),
    }
}

/// `map`'s entry `key`. `V` must be the map's value type, `#[repr(C)]` and valid for any bytes.
pub(crate) fn lookup_elem<V: Copy + Default>(map: &OwnedFd, key: u32) -> io::Result<V> {
    let mut value = V::default();
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: ptr::from_ref(&key) as u64,
        value: ptr::from_mut(&mut value) as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)?;
    Ok(value)
}

/// Loads `insns` as an XDP program. On a verifier rejection the error carries the verifier's
/// last lines.
pub(crate) fn load_xdp(insns: &[Insn]) -> io::Result<OwnedFd> {
    const LICENSE: &CStr = c"Dual MIT/GPL";
    let mut log = vec![0u8; 64 * 1024];
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        prog_name: name16("chimed_xdp"),
        expected_attach_type: BPF_XDP,
        ..Default::default()
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(owned(fd)),
        Err(e)
            if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EINVAL) =>
        {
            // Load again with the verifier's log, only to say why.
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let again = bpf(BPF_PROG_LOAD, &mut attr);
            if let Ok(fd) = again {
                return Ok(owned(fd));
            }
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            Err(io::Error::new(
                e.kind(),
                format!(
                    "the kernel's verifier refused the XDP program ({e}): {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                ),
            ))
        }
        Err(e) => Err(e),
    }
}

/// What one run of an XDP program on a frame gave ([`test_run`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TestRun {
    /// The program's verdict (`XDP_PASS`, `XDP_TX`, ...).
    pub(crate) verdict: u32,
    /// The metadata the program left ahead of the frame (empty if it left none).
    pub(crate) meta: Vec<u8>,
    /// The frame as the program left it.
    pub(crate) frame: Vec<u8>,
    /// How long the run took, in nanoseconds, as the kernel measures it: the program's own cost,
    /// without a driver or a system call around it.
    pub(crate) ns: u32,
}

/// `struct xdp_md` as `BPF_PROG_TEST_RUN` reads and writes it: offsets into its data.
#[repr(C)]
#[derive(Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

/// Runs the XDP program `prog` once on `frame` with `BPF_PROG_TEST_RUN`, as on a frame received
/// on queue 0 of the loopback interface: the kernel's own run of the program, on no interface.
/// The kernel refuses (`EINVAL`) frames shorter than an Ethernet header.
pub(crate) fn test_run(prog: &OwnedFd, frame: &[u8]) -> io::Result<TestRun> {
    // Room for the frame and for metadata the program may put ahead of it.
    let mut out = vec![0u8; frame.len() + 256];
    // The frame starts the data, with no metadata before it; the kernel says where it ends up.
    let ctx_in = XdpMd {
        data_end: frame.len() as u32,
        ..Default::default()
    };
    let mut ctx_out = XdpMd::default();
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_size_out: out.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        ctx_size_in: size_of::<XdpMd>() as u32,
        ctx_size_out: size_of::<XdpMd>() as u32,
        ctx_in: ptr::from_ref(&ctx_in) as u64,
        ctx_out: ptr::from_mut(&mut ctx_out) as u64,
        ..Default::default()
    };
    bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    // The kernel copies out from the metadata's start; `ctx_out` says where the frame begins.
    let len = (attr.data_size_out as usize).min(out.len());
    let data = (ctx_out.data as usize).min(len);
    let end = (ctx_out.data_end as usize).clamp(data, len);
    Ok(TestRun {
        verdict: attr.retval,
        meta: out[..data].to_vec(),
        frame: out[data..end].to_vec(),
        ns: attr.duration,
    })
}

/// Attaches `prog` to interface `ifindex` in driver mode, through a link that detaches it when
/// the returned descriptor (and any duplicate) is closed.
pub(crate) fn attach_xdp(prog: &OwnedFd, ifindex: u32) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags: XDP_FLAGS_DRV_MODE,
    };
    bpf(BPF_LINK_CREATE, &mut attr).map(owned)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn every_jump_lands_inside_the_program() {
        let targets = [
            (None, 123),
            (Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))), 2002),
            (Some(IpAddr::V6(Ipv6Addr::LOCALHOST)), 123),
        ];
        assert_jumps_land_inside(&program(3, &targets));
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(cpus_in_list("0"), Some(1));
        assert_eq!(cpus_in_list("0-1"), Some(2));
        assert_eq!(cpus_in_list("0,2-5"), Some(5));
        assert_eq!(cpus_in_list("0-3,8-11"), Some(8));
        assert_eq!(cpus_in_list("3-1"), None);
        assert_eq!(cpus_in_list(""), None);
    }
}
