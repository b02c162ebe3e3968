//! Runs a command line: [`main`] dispatches to one small function per
//! command. Changes go to the daemon of `--iface` (or the only one of this
//! network namespace); reads fall back on a program's pins when no daemon
//! runs. Called by the binary's `main` with what clap parsed.

use std::time::Duration;

use ratelimit_host::shutdown_signal;
use serde::de::DeserializeOwned;

use super::{
    args::{
        Cli, Command, DetachArgs, ExplainArgs, GcArgs, GetArgs, ListArgs, ListableArgs, LogArgs,
        ModeArgs, ReadArgs, ReloadArgs, ResetArgs, SetArgs, StatsArgs, Target, TopArgs, UnsetArgs,
    },
    print,
};
use crate::{
    daemon::{self, offline},
    error::{Error, Result},
    host::input,
    model::lists::{self, ListAction},
    protocol::{
        self, Connection, Request, ResetScope,
        answer::{
            Answer, Changed, DropLog, Explained, FleetTop, ListLoaded, Rules, States, Stats,
            Status, Top,
        },
    },
};

/// Runs the command line.
pub async fn main(cli: Cli) -> Result<()> {
    if !matches!(cli.command, Command::Run(_) | Command::Serve(_)) {
        // A command's output piped into `head` ends quietly when the reader
        // goes, as other tools' do (Rust ignores SIGPIPE, and printing would
        // panic). Not for the daemons, whose sockets' peers may go any time.
        // SAFETY: setting a signal's disposition to the default.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let change = cli.command.change_target().map(|t| t.map(str::to_string));
    let done = run_command(cli.command).await;
    match (&change, done) {
        (Some(want), Err(e @ (Error::NoDaemon { .. } | Error::NoDaemonHere { .. }))) => {
            Err(adopt_hint(want.as_deref()).unwrap_or(e))
        }
        (_, done) => done,
    }
}

async fn run_command(command: Command) -> Result<()> {
    match command {
        Command::Run(args) => {
            let opts = args.options()?;
            daemon::run(opts, shutdown_signal()).await
        }
        // `main` hands `serve` to the service's own binary before any runtime.
        Command::Serve(_) => Err(super::serve::exec()),
        Command::Gc(g) => gc(g),
        Command::Detach(d) => detach(d),
        Command::Explain(e) => explain(e).await,
        Command::Get(g) => get(g).await,
        Command::Check(a) => {
            if !super::check::command(&a.config, a.json, a.max_rules, a.max_list_entries) {
                // The report is printed; 2 is invalid input's exit status.
                std::process::exit(2);
            }
            Ok(())
        }
        Command::Completions(c) => super::docs::print_completions(c.shell),
        Command::Man(m) => super::docs::print_man(m.page.as_deref(), m.out.as_deref()),
        Command::Set(a) => set(a).await,
        Command::Allow(a) => listable(a, ListAction::Allow).await,
        Command::Deny(a) => listable(a, ListAction::Deny).await,
        Command::Unset(a) => unset(a).await,
        Command::Mode(m) => mode(m).await,
        Command::Reset(r) => reset(r).await,
        Command::Reload(r) => reload(r).await,
        Command::List(l) => list(l).await,
        Command::Status(r) => status(r).await,
        Command::Stats(s) => stats(s).await,
        Command::Top(t) if t.fleet => fleet_top(t).await,
        Command::Top(t) => top(t).await,
        Command::Log(l) => drop_log(l).await,
    }
}

/// Asks `daemon` for a change and says what changed.
async fn change(daemon: Connection, request: &Request, quiet: bool) -> Result<()> {
    let changed: Changed = daemon.ask(request).await?;
    print::changes(&changed.changes, quiet);
    Ok(())
}

/// `ratelimit set`.
async fn set(a: SetArgs) -> Result<()> {
    let checked = a.check()?;
    let daemon = protocol::connect(&iface(&a.target_daemon)?).await?;
    change(daemon, &checked.request()?, a.change.quiet).await
}

/// What `source` covers of what must stay reachable: loopback and the
/// addresses of this namespace's interfaces (where the CLI runs, the
/// daemon's), as `loopback 127.0.0.1` or `this host's 198.18.0.2`.
fn reachable_covered(source: &crate::model::prefix::Prefix) -> Vec<String> {
    use crate::model::{matching::contains, prefix::Prefix};
    let mut out = Vec::new();
    let mut addrs: Vec<std::net::IpAddr> = vec![
        std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::Ipv6Addr::LOCALHOST.into(),
    ];
    addrs.extend(crate::host::addresses::own());
    addrs.sort_unstable();
    addrs.dedup();
    for a in addrs {
        let len = if a.is_ipv4() { 32 } else { 128 };
        if Prefix::parse("address", &format!("{a}/{len}")).is_ok_and(|p| contains(source, &p)) {
            let who = if a.is_loopback() {
                "loopback"
            } else {
                "this host's"
            };
            out.push(format!("{who} {a}"));
        }
    }
    out
}

/// `allow` or `deny`: one CIDR, or a list of `action` (`--from`).
async fn listable(a: ListableArgs, action: ListAction) -> Result<()> {
    let for_ms = a.change.for_ms()?;
    let Some(from) = &a.from else {
        let Some(cidr) = &a.cidr else {
            return Err(Error::invalid("CIDR", "give a CIDR, or --from FILE"));
        };
        let daemon = protocol::connect(&iface(&a.target)?).await?;
        let rule = a.matches.selector(cidr)?;
        let covers = (action == ListAction::Deny).then(|| reachable_covered(&rule.source));
        let request = match action {
            ListAction::Allow => Request::Allow { rule, for_ms },
            ListAction::Deny => Request::Deny { rule, for_ms },
        };
        change(daemon, &request, a.change.quiet).await?;
        // Applied as asked (the operator may mean it), but said.
        if let Some(covered) = covers.filter(|c| !c.is_empty()) {
            eprintln!(
                "warning: this deny covers {}: frames from there are dropped too (`ratelimit unset` removes it)",
                covered.join(", ")
            );
        }
        return Ok(());
    };
    if a.matches.any() {
        return Err(Error::invalid(
            "--from",
            "list entries match the source alone: leave out --proto, --dport, --syn, --icmp-type and --to (or give such rules with `ratelimit set`)",
        ));
    }
    // A regular file (or standard input), at most LIST_MAX_BYTES.
    let (source, text) = if from == "-" {
        let text = input::read_stdin(input::Kind::List).map_err(|e| Error::invalid("--from", e))?;
        ("stdin".to_string(), text)
    } else {
        let text = input::read(std::path::Path::new(from), input::Kind::List, from)
            .map_err(|e| Error::invalid("--from", e))?;
        (from.clone(), text)
    };
    let name = match (&a.name, from.as_str()) {
        (Some(n), _) => n.clone(),
        (None, "-") => {
            return Err(Error::invalid(
                "--name",
                "a list read from standard input (--from -) needs a name: add --name NAME",
            ));
        }
        (None, path) => lists::default_name(path).unwrap_or_default(),
    };
    lists::check_name("--name", &name)?;
    // Checked here too, so a bad file is reported before the daemon is asked
    // (the daemon checks it again: it is the one writer).
    lists::parse("--from", &source, &text)?;
    let request = Request::LoadList {
        name,
        action,
        source,
        text,
        for_ms,
    };
    let loaded: ListLoaded = protocol::call(&iface(&a.target)?, &request).await?;
    if !a.change.quiet {
        println!("{}", loaded.loaded.summary);
    }
    Ok(())
}

/// `ratelimit unset`: a selector's rule, or a list.
async fn unset(a: UnsetArgs) -> Result<()> {
    let iface = iface(&a.target)?;
    let cidr = match (&a.list, &a.cidr) {
        (Some(name), _) => {
            if a.matches.any() {
                return Err(Error::invalid(
                    "--list",
                    "a list is removed by its name alone: leave out --proto, --dport, --syn, --icmp-type and --to",
                ));
            }
            let request = Request::UnsetList { name: name.clone() };
            return change(protocol::connect(&iface).await?, &request, a.quiet.quiet).await;
        }
        (None, Some(cidr)) => cidr,
        (None, None) => {
            return Err(Error::invalid("CIDR", "give a CIDR, or --list NAME"));
        }
    };
    let daemon = protocol::connect(&iface).await?;
    let request = Request::Unset {
        rule: a.matches.selector(cidr)?,
        only_temporary: a.only_temporary,
    };
    change(daemon, &request, a.quiet.quiet).await
}

/// `ratelimit mode`.
async fn mode(m: ModeArgs) -> Result<()> {
    let daemon = protocol::connect(&iface(&m.target)?).await?;
    change(daemon, &Request::Mode { mode: m.mode }, m.quiet.quiet).await
}

/// `ratelimit reset`.
async fn reset(r: ResetArgs) -> Result<()> {
    let daemon = protocol::connect(&iface(&r.target)?).await?;
    let scope = match (r.live, r.config) {
        (true, _) => ResetScope::Live,
        (_, true) => ResetScope::Config,
        _ => ResetScope::All,
    };
    change(daemon, &Request::Reset { scope }, r.quiet.quiet).await
}

/// `ratelimit reload`.
async fn reload(r: ReloadArgs) -> Result<()> {
    let daemon = protocol::connect(&iface(&r.target)?).await?;
    let request = Request::Reload { replace: r.replace };
    change(daemon, &request, r.quiet.quiet).await
}

/// `ratelimit list`.
async fn list(l: ListArgs) -> Result<()> {
    let rules: Rules = read(&l.read.target, &Request::List { counters: l.stats }).await?;
    if l.read.json {
        print::json(&rules);
    } else {
        print::list(&rules);
        if l.stats {
            print::rule_counters(&rules);
        }
    }
    Ok(())
}

/// `ratelimit status`.
async fn status(r: ReadArgs) -> Result<()> {
    let mut status: Status = read(&r.target, &Request::Status).await?;
    status.orphaned_pins = crate::kernel::pins::orphans();
    if !status.orphaned_pins.is_empty() {
        let bytes: u64 = status.orphaned_pins.iter().map(|o| o.bytes).sum();
        status.notes.push(format!(
            "{} of kernel memory held for nothing by {} pin director{} of network namespaces that are gone: `ratelimit gc` removes {}",
            print::mib(bytes),
            status.orphaned_pins.len(),
            if status.orphaned_pins.len() == 1 { "y" } else { "ies" },
            if status.orphaned_pins.len() == 1 { "it" } else { "them" },
        ));
    }
    if r.json {
        print::json(&status);
    } else {
        print::status(&status);
    }
    Ok(())
}

/// An address the user typed, or an error naming `field`.
fn address(field: &str, s: &str) -> Result<std::net::IpAddr> {
    s.trim().parse().map_err(|_| {
        Error::invalid(
            field,
            format!("{s:?} is not an IP address: give one like 198.18.0.20 or 2001:db8::7"),
        )
    })
}

/// `ratelimit explain`: asks the daemon (it holds the rules and the maps).
async fn explain(e: ExplainArgs) -> Result<()> {
    let probe = crate::kernel::explain::Probe {
        source: Some(address("SOURCE", &e.source)?),
        dest: e.to.as_deref().map(|t| address("--to", t)).transpose()?,
        proto: e
            .proto
            .as_deref()
            .map(|p| crate::model::matching::parse_proto("--proto", p))
            .transpose()?,
        dport: e.dport,
        syn: e.syn,
        icmp_type: e.icmp_type,
    };
    let daemon = protocol::connect(&iface(&e.read.target)?).await?;
    let answer: Explained = daemon.ask(&Request::Explain { probe }).await?;
    if e.read.json {
        print::json(&answer);
    } else {
        print::explained(&answer);
    }
    Ok(())
}

/// `ratelimit get`.
async fn get(g: GetArgs) -> Result<()> {
    let source = address("SOURCE", &g.source)?;
    let daemon = protocol::connect(&iface(&g.read.target)?).await?;
    let answer: States = daemon.ask(&Request::Get { source }).await?;
    if g.read.json {
        print::json(&answer);
    } else {
        print::states(&answer);
    }
    Ok(())
}

/// Refuses a command on pins to a user other than root.
fn pins_are_root_s() -> Result<()> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::Permission(
            "the pins under /sys/fs/bpf are root's; run the command as root (for example with sudo)"
                .into(),
        ));
    }
    Ok(())
}

/// `ratelimit detach`: a program pinned and enforcing with no daemon (left
/// by `--keep-attached`, or a daemon killed) stops: its pins go, and with
/// the link's the program leaves the interface. Refused while a daemon runs
/// on the interface (stopping it detaches). Where nothing is pinned there is
/// nothing to do, and it says so and succeeds: what the operator wants, no
/// program left, holds (a cleanup script's second `detach` is no error).
/// The saved rules stay for the next daemon.
fn detach(a: DetachArgs) -> Result<()> {
    pins_are_root_s()?;
    let pinned = offline::pinned_here()?;
    let nothing = |what: &str| {
        if !a.quiet.quiet {
            let what = if what.is_empty() {
                String::new()
            } else {
                format!(" {what}")
            };
            println!("nothing to detach: no program is pinned{what} in this network namespace");
        }
        Ok(())
    };
    let iface = match (&a.target.iface, pinned.as_slice()) {
        (Some(i), _) => i.clone(),
        (None, [one]) => one.clone(),
        (None, []) => return nothing(""),
        (None, many) => {
            return Err(Error::invalid(
                "--iface",
                format!(
                    "programs are pinned for {} in this network namespace: say which with --iface",
                    many.join(", ")
                ),
            ));
        }
    };
    if protocol::daemons_here()?.contains(&iface) {
        return Err(Error::Refused(format!(
            "a daemon runs on {iface}: stop it (Ctrl-C, or kill -TERM its pid: `ratelimit status --iface {iface}` shows it), and it detaches as it stops; `ratelimit detach` is for a program left enforcing without a daemon"
        )));
    }
    if !pinned.contains(&iface) {
        return nothing(&format!("for {iface}"));
    }
    let id = crate::host::identity::Identity::here(&iface)?;
    let root = crate::host::identity::find_bpffs()?
        .ok_or_else(|| Error::Refused("no bpffs holds pins here".into()))?;
    let dir = crate::host::identity::pin_dir(&root.path, &id);
    crate::kernel::remove_pins(&dir)?;
    if !a.quiet.quiet {
        println!(
            "detached from {id}: its program and pins are gone; the saved rules stay for the next `ratelimit run --iface {iface}`"
        );
    }
    Ok(())
}

/// `ratelimit gc`: removes the pins of namespaces that are gone, and says
/// what it removed and the memory that freed.
fn gc(g: GcArgs) -> Result<()> {
    pins_are_root_s()?;
    let removed = crate::kernel::pins::remove_orphans();
    if g.json {
        print::json(&serde_json::json!({ "removed": removed }));
        return Ok(());
    }
    if removed.is_empty() {
        println!("no pins of network namespaces that are gone");
    }
    for o in &removed {
        println!(
            "removed {} ({} freed)",
            o.dir.display(),
            print::mib(o.bytes)
        );
    }
    Ok(())
}

/// `ratelimit stats`, once or `--watch`.
async fn stats(s: StatsArgs) -> Result<()> {
    // On a terminal the screen is refreshed in place; into a pipe or a file
    // each reading follows the last (with --json, one object per line).
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        let stats: Stats = read(&s.read.target, &Request::Stats).await?;
        if s.watch && tty {
            // Clear the screen and home the cursor.
            print!("\x1b[2J\x1b[H");
        } else if s.watch && !s.read.json {
            // Into a pipe each reading follows the last: a line that says
            // when it was taken tells one from the next.
            println!(
                "--- {}",
                crate::model::describe::rfc3339(crate::host::clock::now_ms())
            );
        }
        match (s.read.json, s.watch && !tty) {
            (true, true) => print::json_line(&stats),
            (true, false) => print::json(&stats),
            (false, _) => print::stats(&stats),
        }
        if s.watch && !tty {
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
        }
        if !s.watch {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = shutdown_signal() => return Ok(()),
        }
    }
}

/// `ratelimit top --fleet`: from the daemon's Redis, so a daemon must run.
async fn fleet_top(t: TopArgs) -> Result<()> {
    let fleet: FleetTop =
        protocol::call(&iface(&t.read.target)?, &Request::FleetTop { n: t.n }).await?;
    if t.read.json {
        print::json(&fleet);
    } else {
        print::fleet_top(&fleet);
    }
    Ok(())
}

/// `ratelimit top`.
async fn top(t: TopArgs) -> Result<()> {
    let top: Top = read(&t.read.target, &Request::Top { n: t.n }).await?;
    if t.read.json {
        print::json(&top);
    } else {
        print::top(&top);
    }
    Ok(())
}

/// How often `log --follow` asks for new entries.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// `ratelimit log`, once or `--follow`: from the daemon (which alone reads
/// the program's ring buffer).
async fn drop_log(l: LogArgs) -> Result<()> {
    let iface = iface(&l.target)?;
    let mut request = Request::Log {
        after: None,
        n: l.n,
    };
    let first: DropLog = protocol::call(&iface, &request).await?;
    if first.drop_log == "off" && first.entries.is_empty() {
        eprintln!(
            "ratelimit: the drop log is off: `ratelimit run --drop-log 100/s` (or `drop-log = \"100/s\"` in the config file) turns it on"
        );
    }
    print::drop_log_entries(&first, l.json);
    if !l.follow {
        if !l.json {
            print::drop_log_summary(&first);
        }
        return Ok(());
    }
    let mut next = first.next;
    let signal = shutdown_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            () = tokio::time::sleep(FOLLOW_EVERY) => {}
            () = &mut signal => return Ok(()),
        }
        if stdout_closed() {
            return Ok(());
        }
        request = Request::Log {
            after: Some(next),
            n: crate::daemon::droplog::KEPT,
        };
        let got: DropLog = match protocol::call(&iface, &request).await {
            Ok(got) => got,
            Err(Error::NoDaemon { .. } | Error::NoDaemonHere { .. }) => {
                eprintln!("ratelimit: the daemon of {iface} stopped");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if got.next < next {
            // Another daemon since (its numbers start again).
            eprintln!("ratelimit: the daemon of {iface} started again");
        }
        if got.missed > 0 {
            eprintln!(
                "ratelimit: {} entries came and went between two readings (the daemon keeps the last {})",
                got.missed,
                crate::daemon::droplog::KEPT
            );
        }
        print::drop_log_entries(&got, l.json);
        next = got.next;
    }
}

/// Whether standard output is a pipe or socket whose reader has gone: `log
/// --follow` then ends, though it has nothing to write.
fn stdout_closed() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a zero timeout.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n == 1 && fd.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// The daemon a change goes to.
fn iface(t: &Target) -> Result<String> {
    match &t.iface {
        Some(i) => Ok(i.clone()),
        None => protocol::only_daemon(),
    }
}

/// After a change found no daemon: the error that says nothing changed and
/// how to adopt the programs of this namespace pinned and enforcing on
/// their own (`want`: the one of `--iface`), if there are any.
fn adopt_hint(want: Option<&str>) -> Option<Error> {
    let ifaces: Vec<String> = offline::pinned_here()
        .unwrap_or_default()
        .into_iter()
        .filter(|i| want.is_none_or(|w| w == i))
        .collect();
    (!ifaces.is_empty()).then(|| Error::NoDaemonPinned {
        where_: want.map_or("in this network namespace".to_string(), |w| {
            format!("on {w}")
        }),
        ifaces,
    })
}

/// Sends a read-only request to the daemon; with no daemon, answers it from
/// the pinned maps of a program that enforces on its own (and says so on
/// stderr). `A`: the request's answer.
async fn read<A>(t: &Target, request: &Request) -> Result<A>
where
    A: DeserializeOwned + TryFrom<Answer, Error = Answer>,
{
    let daemon = match &t.iface {
        Some(i) => Ok(i.clone()),
        None => protocol::only_daemon(),
    };
    let (want, no_daemon) = match daemon {
        Ok(iface) => match protocol::call(&iface, request).await {
            Err(e @ Error::NoDaemon { .. }) => (Some(iface), e),
            answer => return answer,
        },
        Err(e @ Error::NoDaemonHere { .. }) => (None, e),
        // Several daemons (--iface says which), not root, …
        Err(e) => return Err(e),
    };
    let iface = match want {
        Some(i) => i,
        None => {
            let mut pinned = offline::pinned_here().unwrap_or_default();
            match pinned.len() {
                0 => return Err(no_daemon),
                1 => pinned.remove(0),
                _ => {
                    return Err(Error::invalid(
                        "--iface",
                        format!(
                            "no daemon runs in this network namespace, and programs are pinned for {}: say which with --iface",
                            pinned.join(", ")
                        ),
                    ));
                }
            }
        }
    };
    match offline::Pinned::open(&iface)? {
        Some(p) => {
            // Once, also under `stats --watch`.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                eprintln!("ratelimit: {}", p.note());
            }
            A::try_from(p.answer(request).await?).map_err(|other| {
                Error::Refused(format!("the pins answered another request: {other:?}"))
            })
        }
        None => Err(no_daemon),
    }
}
