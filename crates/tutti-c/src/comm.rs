//! Making and ending communicators: unique ids, init (by rank, all
//! threads of one process, from a launcher's environment), split, shrink,
//! abort, destroy, and what a communicator knows about itself.

use crate::handle::{fail_local, guard, with_comm, Failure};
use crate::*;
use std::ffi::CStr;
use std::sync::Arc;
use std::time::Duration;
use tutti::{Algorithm, Communicator, Config, DataType, Options, UniqueId};

/// What a caller's config asks for: a deadline, an algorithm, a wire type.
#[derive(Default)]
struct Wanted {
    timeout: Option<Duration>,
    algorithm: Option<Algorithm>,
    wire: Option<DataType>,
}

/// Reads the fields of `*cfg` that the caller's struct has.
///
/// # Safety
/// `cfg` must be NULL or point to a `tuttiConfig_t` of at least
/// `cfg->size` bytes.
unsafe fn read_config(cfg: *const tuttiConfig_t, call: &str) -> Result<Wanted, Failure> {
    if cfg.is_null() {
        return Ok(Wanted::default());
    }
    // SAFETY: non-null; every config starts with its size.
    let size = unsafe { std::ptr::addr_of!((*cfg).size).read_unaligned() };
    let has = |end: usize| size >= end;
    use std::mem::{offset_of, size_of};
    if !has(offset_of!(tuttiConfig_t, version) + size_of::<u32>()) {
        return Err(Failure::arg(format!(
            "{call}: config->size is {size}; initialize the config with TUTTI_CONFIG_INITIALIZER"
        )));
    }
    // SAFETY: the caller's struct has these fields (its size says so).
    let magic = unsafe { std::ptr::addr_of!((*cfg).magic).read_unaligned() };
    if magic != TUTTI_CONFIG_MAGIC {
        return Err(Failure::arg(format!(
            "{call}: config->magic is {magic:#x}; initialize the config with TUTTI_CONFIG_INITIALIZER"
        )));
    }
    let mut w = Wanted::default();
    if has(offset_of!(tuttiConfig_t, timeoutMs) + size_of::<i64>()) {
        // SAFETY: within the caller's struct, as its size says.
        let ms = unsafe { std::ptr::addr_of!((*cfg).timeoutMs).read_unaligned() };
        if ms < 0 {
            return Err(Failure::arg(format!(
                "{call}: config->timeoutMs is {ms}; it must be 0 (the default) or positive"
            )));
        }
        w.timeout = (ms > 0).then(|| Duration::from_millis(ms as u64));
    }
    if has(offset_of!(tuttiConfig_t, algorithm) + size_of::<c_int>()) {
        // SAFETY: within the caller's struct, as its size says.
        let a = unsafe { std::ptr::addr_of!((*cfg).algorithm).read_unaligned() };
        w.algorithm = match a {
            tuttiAlgoAuto => None,
            tuttiAlgoRing => Some(Algorithm::Ring),
            tuttiAlgoTree => Some(Algorithm::Tree),
            tuttiAlgoDoubleTree => Some(Algorithm::DoubleTree),
            tuttiAlgoHalvingDoubling => Some(Algorithm::HalvingDoubling),
            tuttiAlgoDirect => Some(Algorithm::Direct),
            tuttiAlgoPairwise => Some(Algorithm::Pairwise),
            tuttiAlgoTwoShot => Some(Algorithm::TwoShot),
            _ => {
                return Err(Failure::arg(format!(
                    "{call}: config->algorithm {a} is not a tuttiAlgo_t"
                )))
            }
        };
    }
    if has(offset_of!(tuttiConfig_t, wireType) + size_of::<c_int>()) {
        // SAFETY: within the caller's struct, as its size says.
        let t = unsafe { std::ptr::addr_of!((*cfg).wireType).read_unaligned() };
        w.wire = match t {
            TUTTI_WIRE_NATIVE => None,
            tuttiBfloat16 => Some(DataType::Bf16),
            tuttiFloat16 => Some(DataType::F16),
            _ => {
                return Err(Failure::arg(format!(
                    "{call}: config->wireType {t} is not a wire type; allowed: tuttiBfloat16, \
                     tuttiFloat16 or TUTTI_WIRE_NATIVE"
                )))
            }
        };
    }
    Ok(w)
}

/// The library configuration (`TUTTI_*`) with the caller's wishes applied.
fn config_for(w: &Wanted, call: &str) -> Result<Config, Failure> {
    let mut c = Config::from_env().map_err(|e| Failure {
        code: handle::code_of(&e),
        msg: format!("{call}: {e}"),
    })?;
    if let Some(t) = w.timeout {
        c.timeout = t;
    }
    if let Some(a) = w.algorithm {
        c.algo = tutti::config::AlgoOverride {
            global: Some(a),
            ..Default::default()
        };
    }
    Ok(c)
}

fn opts_for(w: &Wanted) -> Options {
    Options {
        algorithm: None,
        timeout: w.timeout,
        wire: w.wire,
    }
}

/// Writes `h` to `*out`.
///
/// # Safety
/// `out` must be valid for a write of a handle.
unsafe fn put(out: *mut tuttiComm_t, h: tuttiComm_t) {
    // SAFETY: the caller checked `out` and promises it is writable.
    unsafe { out.write(h) };
}

fn null(what: &str, call: &str) -> Failure {
    Failure::arg(format!("{call}: {what} is NULL"))
}

/// Makes a new unique id in `*uniqueId`, for [`tuttiCommInitRank`]. Call
/// it in the process that will run rank 0, and pass the id's bytes to the
/// other ranks.
///
/// # Safety
/// `uniqueId` must be NULL or valid for a write of a `tuttiUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn tuttiGetUniqueId(uniqueId: *mut tuttiUniqueId) -> tuttiResult_t {
    const CALL: &str = "tuttiGetUniqueId";
    guard(CALL, None, || {
        if uniqueId.is_null() {
            return Err(null("uniqueId", CALL));
        }
        let id = UniqueId::new().map_err(|e| Failure {
            code: handle::code_of(&e),
            msg: format!("{CALL}: {e}"),
        })?;
        let text = id.to_string();
        let mut out = tuttiUniqueId {
            internal: [0; TUTTI_UNIQUE_ID_BYTES],
        };
        for (o, b) in out.internal.iter_mut().zip(text.bytes()) {
            *o = b as std::ffi::c_char;
        }
        // SAFETY: checked non-null; the caller promises it is writable.
        unsafe { uniqueId.write(out) };
        Ok(())
    })
}

/// Joins the job named by `commId` as `rank` of `nranks`; blocks until
/// every rank has joined (or the connect deadline, `TUTTI_CONNECT_TIMEOUT`).
///
/// # Safety
/// `comm` must be valid for a write; `commId` must point to an id made by
/// [`tuttiGetUniqueId`] (or its bytes).
#[no_mangle]
pub unsafe extern "C" fn tuttiCommInitRank(
    comm: *mut tuttiComm_t,
    nranks: c_int,
    commId: tuttiUniqueId,
    rank: c_int,
) -> tuttiResult_t {
    // SAFETY: the caller's promises, passed on.
    unsafe { tuttiCommInitRankConfig(comm, nranks, commId, rank, std::ptr::null_mut()) }
}

/// [`tuttiCommInitRank`] with a config (NULL: the defaults).
///
/// # Safety
/// As for [`tuttiCommInitRank`]; `config` is NULL or an initialized config.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommInitRankConfig(
    comm: *mut tuttiComm_t,
    nranks: c_int,
    commId: tuttiUniqueId,
    rank: c_int,
    config: *mut tuttiConfig_t,
) -> tuttiResult_t {
    const CALL: &str = "tuttiCommInitRank";
    guard(CALL, None, || {
        if comm.is_null() {
            return Err(null("comm", CALL));
        }
        if nranks < 1 || rank < 0 || rank >= nranks {
            return Err(Failure::arg(format!(
                "{CALL}: rank {rank} of {nranks} ranks; it needs nranks >= 1 and 0 <= rank < nranks"
            )));
        }
        // SAFETY: the caller's promise about `config`.
        let w = unsafe { read_config(config, CALL) }?;
        let bytes: Vec<u8> = commId.internal.iter().map(|&c| c as u8).collect();
        let text = CStr::from_bytes_until_nul(&bytes)
            .ok()
            .and_then(|s| s.to_str().ok())
            .ok_or_else(|| Failure::arg(format!("{CALL}: commId is not a tutti unique id")))?;
        let id: UniqueId = text
            .parse()
            .map_err(|e| Failure::arg(format!("{CALL}: {e}")))?;
        let (n, r) = (nranks as usize, rank as usize);
        let c = Communicator::init_rank_with(&id, n, r, config_for(&w, CALL)?).map_err(|e| {
            Failure {
                code: handle::code_of(&e),
                msg: format!("rank {r} of {n}: {CALL}: {e}"),
            }
        })?;
        // SAFETY: checked non-null; the caller promises it is writable.
        unsafe { put(comm, tuttiComm::into_handle(c, opts_for(&w))) };
        Ok(())
    })
}

/// Makes `ndev` communicators for `ndev` threads of this process (like
/// `ncclCommInitAll`): `comms[r]` is rank `r`. `devlist` is ignored (there
/// are no devices) and may be NULL.
///
/// # Safety
/// `comms` must be valid for writes of `ndev` handles.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommInitAll(
    comms: *mut tuttiComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> tuttiResult_t {
    const CALL: &str = "tuttiCommInitAll";
    let _ = devlist;
    guard(CALL, None, || {
        if comms.is_null() {
            return Err(null("comms", CALL));
        }
        if ndev < 1 {
            return Err(Failure::arg(format!(
                "{CALL}: ndev is {ndev}; it must be >= 1"
            )));
        }
        let w = Wanted::default();
        let cs =
            Communicator::init_all_with(ndev as usize, config_for(&w, CALL)?).map_err(|e| {
                Failure {
                    code: handle::code_of(&e),
                    msg: format!("{CALL}: {e}"),
                }
            })?;
        for (i, c) in cs.into_iter().enumerate() {
            // SAFETY: the caller promises room for `ndev` handles.
            unsafe { put(comms.add(i), tuttiComm::into_handle(c, opts_for(&w))) };
        }
        Ok(())
    })
}

/// Joins the job that the environment describes: `tutti run`'s `TUTTI_*`
/// variables, torchrun's, Slurm's or Open MPI's, in that order. `config`
/// may be NULL.
///
/// # Safety
/// `comm` must be valid for a write; `config` NULL or an initialized config.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommInitFromEnv(
    comm: *mut tuttiComm_t,
    config: *mut tuttiConfig_t,
) -> tuttiResult_t {
    const CALL: &str = "tuttiCommInitFromEnv";
    guard(CALL, None, || {
        if comm.is_null() {
            return Err(null("comm", CALL));
        }
        // SAFETY: the caller's promise about `config`.
        let w = unsafe { read_config(config, CALL) }?;
        let c = Communicator::from_env_with(config_for(&w, CALL)?).map_err(|e| Failure {
            code: handle::code_of(&e),
            msg: format!("{CALL}: {e}"),
        })?;
        // SAFETY: checked non-null; the caller promises it is writable.
        unsafe { put(comm, tuttiComm::into_handle(c, opts_for(&w))) };
        Ok(())
    })
}

/// Splits `comm` like `ncclCommSplit`: every rank calls it; ranks with the
/// same `color` form `*newcomm`, ranked by `key` (ties: by rank); a rank
/// passing [`TUTTI_SPLIT_NOCOLOR`] gets NULL. `config` (may be NULL) sets
/// the new communicator's deadline; without one it keeps `comm`'s.
///
/// # Safety
/// `comm` a live handle; `newcomm` valid for a write; `config` NULL or
/// initialized.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommSplit(
    comm: tuttiComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut tuttiComm_t,
    config: *mut tuttiConfig_t,
) -> tuttiResult_t {
    const CALL: &str = "tuttiCommSplit";
    // SAFETY: the caller's promise about `comm`.
    unsafe {
        with_comm(CALL, comm, |c| {
            if newcomm.is_null() {
                return Err(null("newcomm", CALL));
            }
            if color < TUTTI_SPLIT_NOCOLOR {
                return Err(Failure::arg(format!(
                    "{CALL}: color {color}; it must be >= 0 or TUTTI_SPLIT_NOCOLOR"
                )));
            }
            // SAFETY: the caller's promise about `config`.
            let w = read_config(config, CALL)?;
            let color = (color >= 0).then_some(color as u32);
            let sub = c
                .comm
                .split(color, key as i64)
                .map_err(|e| Failure::of(c, CALL, &e))?;
            let opts = if config.is_null() {
                c.config_opts()
            } else {
                opts_for(&w)
            };
            let h = sub.map_or(std::ptr::null_mut(), |s| tuttiComm::into_handle(s, opts));
            put(newcomm, h);
            Ok(())
        })
    }
}

/// No flags: the survivors build the new communicator.
pub const TUTTI_SHRINK_DEFAULT: c_int = 0;
/// Abort `comm`'s pending operations first.
pub const TUTTI_SHRINK_ABORT: c_int = 1;

/// A new communicator of every rank of `comm` except the
/// `excludeRanksCount` ranks listed (like `ncclCommShrink`): after a rank
/// died, every survivor calls it with the same list.
///
/// # Safety
/// `comm` a live handle; `excludeRanksList` valid for
/// `excludeRanksCount` reads; `newcomm` valid for a write; `config` NULL
/// or initialized.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommShrink(
    comm: tuttiComm_t,
    excludeRanksList: *const c_int,
    excludeRanksCount: c_int,
    newcomm: *mut tuttiComm_t,
    config: *mut tuttiConfig_t,
    shrinkFlags: c_int,
) -> tuttiResult_t {
    const CALL: &str = "tuttiCommShrink";
    // SAFETY: the caller's promise about `comm`.
    unsafe {
        with_comm(CALL, comm, |c| {
            if newcomm.is_null() {
                return Err(null("newcomm", CALL));
            }
            if excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList.is_null()) {
                return Err(Failure::arg(format!(
                    "{CALL}: excludeRanksList is {:?} with excludeRanksCount {excludeRanksCount}",
                    excludeRanksList
                )));
            }
            if shrinkFlags != TUTTI_SHRINK_DEFAULT && shrinkFlags != TUTTI_SHRINK_ABORT {
                return Err(Failure::arg(format!(
                    "{CALL}: unknown shrinkFlags {shrinkFlags}"
                )));
            }
            let n = c.comm.size();
            let list: &[c_int] = if excludeRanksCount == 0 {
                &[]
            } else {
                // SAFETY: checked non-null; the caller promises the length.
                std::slice::from_raw_parts(excludeRanksList, excludeRanksCount as usize)
            };
            let mut dead = Vec::with_capacity(list.len());
            for &r in list {
                if r < 0 || r as usize >= n {
                    return Err(Failure::arg(format!(
                        "{}: {CALL}: excluded rank {r} is out of range 0..{n}",
                        c.who()
                    )));
                }
                dead.push(r as usize);
            }
            let w = read_config(config, CALL)?;
            if shrinkFlags == TUTTI_SHRINK_ABORT {
                c.comm.abort();
            }
            let s = c.comm.shrink(&dead).map_err(|e| Failure::of(c, CALL, &e))?;
            let opts = if config.is_null() {
                c.config_opts()
            } else {
                opts_for(&w)
            };
            put(newcomm, tuttiComm::into_handle(s, opts));
            Ok(())
        })
    }
}

/// Aborts `comm`: every operation waiting on it, on any thread or queue,
/// and every later one fails at once with [`tuttiAborted`]. Callable from
/// any thread, also while other calls on `comm` run. Unlike NCCL's
/// `ncclCommAbort` it frees nothing (so that those calls never touch freed
/// memory): the handle stays valid, and [`tuttiCommDestroy`] frees it once
/// no other thread uses it.
///
/// # Safety
/// `comm` must be a live handle (not yet destroyed).
#[no_mangle]
pub unsafe extern "C" fn tuttiCommAbort(comm: tuttiComm_t) -> tuttiResult_t {
    // SAFETY: the caller's promise: a live handle.
    unsafe {
        with_comm("tuttiCommAbort", comm, |c| {
            c.comm.abort();
            Ok(())
        })
    }
}

/// Releases `comm` (also after [`tuttiCommAbort`]). As in NCCL, no other
/// call on `comm` may run concurrently with this one. Operations still
/// queued keep the communicator alive until they end; its threads,
/// sockets and shared memory go with the last of them.
///
/// # Safety
/// `comm` must be a live handle, used by no other thread during this
/// call; it must not be used after this call.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommDestroy(comm: tuttiComm_t) -> tuttiResult_t {
    if comm.is_null() {
        return fail_local("tuttiCommDestroy: comm is NULL");
    }
    // SAFETY: the caller's promise: a live handle whose reference this
    // call releases, with no other call on it running.
    let c = unsafe { Arc::from_raw(comm as *const tuttiComm) };
    guard("tuttiCommDestroy", None, move || {
        drop(c);
        Ok(())
    })
}

/// `tuttiCommFinalize` exists in NCCL to flush operations; here every
/// operation of a queue is flushed by `tuttiQueueSynchronize`, so this only
/// checks the handle.
///
/// # Safety
/// `comm` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommFinalize(comm: tuttiComm_t) -> tuttiResult_t {
    // SAFETY: the caller's promise.
    unsafe { with_comm("tuttiCommFinalize", comm, |_| Ok(())) }
}

/// Writes `comm`'s first asynchronous error to `*asyncError`
/// ([`tuttiSuccess`] if none): a timeout, a lost peer, a mismatch or an
/// abort that broke it, or the error of an operation that ran on a queue.
/// Does not wait.
///
/// # Safety
/// `comm` a live handle; `asyncError` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommGetAsyncError(
    comm: tuttiComm_t,
    asyncError: *mut tuttiResult_t,
) -> tuttiResult_t {
    const CALL: &str = "tuttiCommGetAsyncError";
    // SAFETY: the caller's promise.
    unsafe {
        with_comm(CALL, comm, |c| {
            if asyncError.is_null() {
                return Err(null("asyncError", CALL));
            }
            let queued = *c.async_err.lock().unwrap_or_else(|e| e.into_inner());
            let code = match c.comm.error() {
                Some(e) => {
                    c.record(&format!("{}: {e}", c.who()));
                    handle::code_of(&e)
                }
                None => queued.unwrap_or(tuttiSuccess),
            };
            asyncError.write(code);
            Ok(())
        })
    }
}

/// Writes the number of ranks of `comm` to `*count`.
///
/// # Safety
/// `comm` a live handle; `count` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommCount(comm: tuttiComm_t, count: *mut c_int) -> tuttiResult_t {
    // SAFETY: the caller's promise.
    unsafe {
        with_comm("tuttiCommCount", comm, |c| {
            if count.is_null() {
                return Err(null("count", "tuttiCommCount"));
            }
            count.write(c.comm.size() as c_int);
            Ok(())
        })
    }
}

/// Writes this rank's number in `comm` to `*rank`.
///
/// # Safety
/// `comm` a live handle; `rank` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn tuttiCommUserRank(comm: tuttiComm_t, rank: *mut c_int) -> tuttiResult_t {
    // SAFETY: the caller's promise.
    unsafe {
        with_comm("tuttiCommUserRank", comm, |c| {
            if rank.is_null() {
                return Err(null("rank", "tuttiCommUserRank"));
            }
            rank.write(c.comm.rank() as c_int);
            Ok(())
        })
    }
}
