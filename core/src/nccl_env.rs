//! NCCL's environment variables that users already set, and the railcc setting each feeds.
//! A railcc setting takes its `RAILCC_*` variable when set, else the NCCL variable's value
//! translated ([`lookup`]); `Config::from_env`, libnccl and `railcc config` all go through it.
//! NCCL variables with no railcc counterpart are listed too, with what railcc does instead.

/// Reads a variable (normally the process environment).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// One NCCL variable: the railcc variable it feeds (if any), what it does in railcc, and how
/// its value becomes the railcc variable's (None: this value has no railcc meaning).
pub struct NcclVar {
    pub nccl: &'static str,
    pub railcc: Option<&'static str>,
    pub effect: &'static str,
    translate: fn(Env<'_>) -> Option<String>,
}

fn same(nccl: &'static str) -> impl Fn(Env<'_>) -> Option<String> {
    move |env| env(nccl)
}

fn none(_: Env<'_>) -> Option<String> {
    None
}

/// NCCL_ALGO: a single ring or tree maps to railcc's; lists, exclusions and per-collective
/// forms leave railcc's own choice.
fn algo(env: Env<'_>) -> Option<String> {
    let v = env("NCCL_ALGO")?.trim().to_ascii_lowercase();
    matches!(v.as_str(), "ring" | "tree").then_some(v)
}

/// NCCL_PROTO: only Simple (or excluding LL) turns the low-latency kernel off; only LL keeps
/// it for every size it can take.
fn proto(env: Env<'_>) -> Option<String> {
    let v = env("NCCL_PROTO")?.trim().to_ascii_lowercase();
    let excl = v.starts_with('^');
    let names: Vec<&str> = v
        .trim_start_matches('^')
        .split(',')
        .map(str::trim)
        .collect();
    let has_ll = names.contains(&"ll");
    match (excl, has_ll) {
        (true, true) => Some("0".into()),
        (false, false) if names.contains(&"simple") => Some("0".into()),
        (false, true) if names.len() == 1 => Some((64 * 1024).to_string()),
        _ => None,
    }
}

/// An NCCL network name as railcc's transport: Socket is TCP, IB is RDMA (InfiniBand or
/// RoCE); None for a network railcc does not have. NCCL_NET and ncclConfig_t's netName.
pub fn transport_of_net(name: &str) -> Option<&'static str> {
    match name.trim().to_ascii_lowercase().as_str() {
        "socket" => Some("tcp"),
        "ib" => Some("rdma"),
        _ => None,
    }
}

/// NCCL_NET (see [`transport_of_net`]).
fn net(env: Env<'_>) -> Option<String> {
    transport_of_net(&env("NCCL_NET")?).map(String::from)
}

/// NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD sockets per peer (NCCL's defaults 1 and 1
/// for a missing one).
fn nsocks(env: Env<'_>) -> Option<String> {
    let t = env("NCCL_SOCKET_NTHREADS");
    let s = env("NCCL_NSOCKS_PERTHREAD");
    if t.is_none() && s.is_none() {
        return None;
    }
    let n = |v: Option<String>| v.and_then(|x| x.trim().parse::<usize>().ok()).unwrap_or(1);
    Some((n(t) * n(s)).max(1).to_string())
}

/// NCCL_MAX_CTAS, else NCCL_MAX_NCHANNELS: a collective's thread blocks per GPU.
fn blocks(env: Env<'_>) -> Option<String> {
    env("NCCL_MAX_CTAS").or_else(|| env("NCCL_MAX_NCHANNELS"))
}

/// NCCL_MIN_CTAS, else NCCL_MIN_NCHANNELS: a collective's least thread blocks per GPU.
fn min_blocks(env: Env<'_>) -> Option<String> {
    env("NCCL_MIN_CTAS").or_else(|| env("NCCL_MIN_NCHANNELS"))
}

/// NCCL_NET names the transport; else NCCL_IB_DISABLE=1 leaves sockets.
fn net_or_ib_disable(env: Env<'_>) -> Option<String> {
    net(env).or_else(|| {
        env("NCCL_IB_DISABLE")
            .is_some_and(|v| v.trim() == "1")
            .then(|| "tcp".into())
    })
}

/// NCCL_P2P_DISABLE=1 with NCCL_SHM_DISABLE=1 leaves NCCL only the network: so railcc.
fn gpu_path(env: Env<'_>) -> Option<String> {
    let on = |k: &str| env(k).is_some_and(|v| v.trim() == "1");
    (on("NCCL_P2P_DISABLE") && on("NCCL_SHM_DISABLE")).then(|| "net".into())
}

/// NCCL_DEBUG: the levels NCCL knows (case-insensitive); NCCL prints nothing for any other
/// value, and neither does railcc.
fn debug(env: Env<'_>) -> Option<String> {
    let v = env("NCCL_DEBUG")?.trim().to_ascii_lowercase();
    matches!(v.as_str(), "version" | "warn" | "info" | "trace").then_some(v)
}

macro_rules! vars {
    ($($nccl:literal => $railcc:expr, $tr:expr, $effect:literal;)*) => {
        /// Every NCCL variable railcc knows, in `railcc config`'s order.
        pub fn all() -> Vec<NcclVar> {
            vec![$(NcclVar { nccl: $nccl, railcc: $railcc, effect: $effect, translate: $tr },)*]
        }
    };
}

vars! {
    "NCCL_HOSTID" => Some("RAILCC_HOSTID"), |e| same("NCCL_HOSTID")(e), "which host a rank is on";
    "NCCL_SOCKET_IFNAME" => Some("RAILCC_SOCKET_IFNAME"), |e| same("NCCL_SOCKET_IFNAME")(e), "interfaces for sockets, same syntax";
    "NCCL_IB_HCA" => Some("RAILCC_IB_HCA"), |e| same("NCCL_IB_HCA")(e), "RDMA ports, same syntax";
    "NCCL_IB_TIMEOUT" => Some("RAILCC_IB_TIMEOUT"), |e| same("NCCL_IB_TIMEOUT")(e), "RDMA ack timeout exponent";
    "NCCL_IB_RETRY_CNT" => Some("RAILCC_IB_RETRY_CNT"), |e| same("NCCL_IB_RETRY_CNT")(e), "RDMA resends";
    "NCCL_IB_QPS_PER_CONNECTION" => Some("RAILCC_IB_QPS_PER_CONN"), |e| same("NCCL_IB_QPS_PER_CONNECTION")(e), "queue pairs per connection";
    "NCCL_NET" => Some("RAILCC_TRANSPORT"), net_or_ib_disable, "Socket = tcp, IB = rdma";
    "NCCL_IB_DISABLE" => Some("RAILCC_TRANSPORT"), net_or_ib_disable, "1: tcp (when NCCL_NET does not say)";
    "NCCL_IB_TC" => Some("RAILCC_IB_TC"), |e| same("NCCL_IB_TC")(e), "RDMA traffic class";
    "NCCL_IB_SL" => Some("RAILCC_IB_SL"), |e| same("NCCL_IB_SL")(e), "RDMA service level";
    "NCCL_IB_GID_INDEX" => Some("RAILCC_IB_GID_INDEX"), |e| same("NCCL_IB_GID_INDEX")(e), "RoCE GID index";
    "NCCL_SOCKET_NTHREADS" => Some("RAILCC_NSOCKS_PER_PEER"), nsocks, "with NCCL_NSOCKS_PERTHREAD: their product, streams per peer";
    "NCCL_NSOCKS_PERTHREAD" => Some("RAILCC_NSOCKS_PER_PEER"), nsocks, "see NCCL_SOCKET_NTHREADS";
    "NCCL_ALGO" => Some("RAILCC_ALGO"), algo, "Ring or Tree alone; anything else leaves railcc's choice";
    "NCCL_PROTO" => Some("RAILCC_GPU_LL_MAX_BYTES"), proto, "Simple (or ^LL): no low-latency kernel; LL alone: it up to 64 KB";
    "NCCL_MAX_CTAS" => Some("RAILCC_GPU_MAX_BLOCKS"), blocks, "thread blocks per GPU";
    "NCCL_MAX_NCHANNELS" => Some("RAILCC_GPU_MAX_BLOCKS"), blocks, "thread blocks per GPU (when NCCL_MAX_CTAS is unset)";
    "NCCL_MIN_CTAS" => Some("RAILCC_GPU_MIN_BLOCKS"), min_blocks, "least thread blocks per GPU";
    "NCCL_MIN_NCHANNELS" => Some("RAILCC_GPU_MIN_BLOCKS"), min_blocks, "least thread blocks per GPU (when NCCL_MIN_CTAS is unset)";
    "NCCL_P2P_DISABLE" => Some("RAILCC_GPU_PATH"), gpu_path, "with NCCL_SHM_DISABLE=1: GPU data over the network";
    "NCCL_SHM_DISABLE" => Some("RAILCC_GPU_PATH"), gpu_path, "see NCCL_P2P_DISABLE";
    "NCCL_DEBUG" => Some("RAILCC_DEBUG"), debug, "libnccl's messages: WARN prints each error, INFO (or TRACE) also each communicator's path, VERSION nothing (railcc's own log: RAILCC_LOG)";
    "NCCL_DEBUG_SUBSYS" => None, none, "accepted; railcc's messages have no subsystems";
    "NCCL_DEBUG_FILE" => Some("RAILCC_DEBUG_FILE"), |e| same("NCCL_DEBUG_FILE")(e), "libnccl's messages to this file (%h host, %p pid)";
    "NCCL_NVLS_ENABLE" => None, none, "accepted; railcc never uses NVLink multicast";
}

/// The value for railcc variable `railcc`: its own when set, else the first NCCL variable
/// feeding it that translates to a value.
pub fn lookup(env: Env<'_>, railcc: &str) -> Option<String> {
    env(railcc).or_else(|| {
        all()
            .iter()
            .filter(|v| v.railcc == Some(railcc))
            .find_map(|v| (v.translate)(env))
    })
}

/// For `railcc config`: each NCCL variable that is set, its value, and what railcc makes of
/// it ("RAILCC_X=value", "RAILCC_X is set: ignored", "no railcc meaning", or "as above" where
/// no railcc variable takes it and the effect says what happens).
pub fn report(env: Env<'_>) -> Vec<(&'static str, String, String)> {
    all()
        .into_iter()
        .filter_map(|v| {
            let value = env(v.nccl)?;
            let what = match v.railcc {
                Some(r) if env(r).is_some() => format!("{r} is set: ignored"),
                Some(r) => match (v.translate)(env) {
                    Some(t) => format!("{r}={t}"),
                    None => format!("no railcc meaning for this value ({r} keeps its default)"),
                },
                None => "as above".to_string(),
            };
            Some((v.nccl, value, what))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
    }

    #[test]
    fn nccl_values_feed_railcc_settings_unless_railcc_is_set() {
        let env = env_of(&[
            ("NCCL_SOCKET_IFNAME", "=eth1"),
            ("NCCL_NET", "IB"),
            ("NCCL_SOCKET_NTHREADS", "4"),
            ("NCCL_NSOCKS_PERTHREAD", "2"),
            ("NCCL_PROTO", "Simple"),
            ("NCCL_ALGO", "Tree"),
            ("NCCL_MAX_NCHANNELS", "24"),
            ("RAILCC_IB_HCA", "mlx5_0"),
            ("NCCL_IB_HCA", "mlx5_1"),
        ]);
        assert_eq!(
            lookup(&env, "RAILCC_SOCKET_IFNAME").as_deref(),
            Some("=eth1")
        );
        assert_eq!(lookup(&env, "RAILCC_TRANSPORT").as_deref(), Some("rdma"));
        assert_eq!(lookup(&env, "RAILCC_NSOCKS_PER_PEER").as_deref(), Some("8"));
        assert_eq!(
            lookup(&env, "RAILCC_GPU_LL_MAX_BYTES").as_deref(),
            Some("0")
        );
        assert_eq!(lookup(&env, "RAILCC_ALGO").as_deref(), Some("tree"));
        assert_eq!(lookup(&env, "RAILCC_GPU_MAX_BLOCKS").as_deref(), Some("24"));
        assert_eq!(
            lookup(&env, "RAILCC_IB_HCA").as_deref(),
            Some("mlx5_0"),
            "railcc's own wins"
        );
        assert_eq!(lookup(&env, "RAILCC_HOSTID"), None);
        let r = report(&env);
        assert!(r.contains(&(
            "NCCL_IB_HCA",
            "mlx5_1".into(),
            "RAILCC_IB_HCA is set: ignored".into()
        )));
        assert!(r.contains(&("NCCL_NET", "IB".into(), "RAILCC_TRANSPORT=rdma".into())));
    }

    #[test]
    fn ib_variables_and_least_blocks_map_as_nccl_reads_them() {
        let env = env_of(&[
            ("NCCL_IB_DISABLE", "1"),
            ("NCCL_IB_TC", "106"),
            ("NCCL_IB_SL", "3"),
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_MIN_NCHANNELS", "4"),
            ("NCCL_DEBUG_FILE", "/tmp/nccl.%h.%p"),
        ]);
        assert_eq!(lookup(&env, "RAILCC_TRANSPORT").as_deref(), Some("tcp"));
        assert_eq!(lookup(&env, "RAILCC_IB_TC").as_deref(), Some("106"));
        assert_eq!(lookup(&env, "RAILCC_IB_SL").as_deref(), Some("3"));
        assert_eq!(lookup(&env, "RAILCC_IB_GID_INDEX").as_deref(), Some("3"));
        assert_eq!(lookup(&env, "RAILCC_GPU_MIN_BLOCKS").as_deref(), Some("4"));
        assert_eq!(
            lookup(&env, "RAILCC_DEBUG_FILE").as_deref(),
            Some("/tmp/nccl.%h.%p")
        );
        // NCCL_NET says more than NCCL_IB_DISABLE; IB_DISABLE=0 says nothing.
        let env = env_of(&[("NCCL_IB_DISABLE", "1"), ("NCCL_NET", "IB")]);
        assert_eq!(lookup(&env, "RAILCC_TRANSPORT").as_deref(), Some("rdma"));
        let env = env_of(&[("NCCL_IB_DISABLE", "0")]);
        assert_eq!(lookup(&env, "RAILCC_TRANSPORT"), None);
    }

    #[test]
    fn values_railcc_cannot_express_leave_its_choice() {
        let env = env_of(&[
            ("NCCL_ALGO", "Ring,Tree"),
            ("NCCL_PROTO", "LL128"),
            ("NCCL_NET", "Coll"),
        ]);
        assert_eq!(lookup(&env, "RAILCC_ALGO"), None);
        assert_eq!(lookup(&env, "RAILCC_GPU_LL_MAX_BYTES"), None);
        assert_eq!(lookup(&env, "RAILCC_TRANSPORT"), None);
        let env = env_of(&[("NCCL_PROTO", "^LL,LL128"), ("NCCL_P2P_DISABLE", "1")]);
        assert_eq!(
            lookup(&env, "RAILCC_GPU_LL_MAX_BYTES").as_deref(),
            Some("0")
        );
        assert_eq!(
            lookup(&env, "RAILCC_GPU_PATH"),
            None,
            "P2P off alone leaves shared memory in NCCL"
        );
        let env = env_of(&[("NCCL_DEBUG", "yes")]);
        assert_eq!(lookup(&env, "RAILCC_DEBUG"), None);
        let env = env_of(&[("NCCL_DEBUG", "Info")]);
        assert_eq!(lookup(&env, "RAILCC_DEBUG").as_deref(), Some("info"));
        let env = env_of(&[("NCCL_PROTO", "LL")]);
        assert_eq!(
            lookup(&env, "RAILCC_GPU_LL_MAX_BYTES").as_deref(),
            Some("65536")
        );
    }
}
