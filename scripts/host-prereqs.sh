#!/usr/bin/env bash
# Make this machine able to run a local pycli cluster: a Docker engine that answers, and
# debootstrap with Debian's archive keyring to build node images; and able to run the unit
# tests of the alert rules: promtool (Prometheus's rule checker, no Prometheus server).
# Installs what is missing (Debian/Ubuntu, root), starts dockerd when nothing answers, and
# says what it did. Safe to run again.
set -euo pipefail

say() { printf 'host-prereqs: %s\n' "$*"; }
die() { printf 'host-prereqs: error: %s\n' "$*" >&2; exit 2; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "$1 needs root: run 'sudo $0'"
}

apt_updated=0
apt_update_once() {
    if [ "$apt_updated" -eq 0 ]; then
        apt-get update -qq
        apt_updated=1
    fi
}

apt_install() {
    need_root "installing $*"
    command -v apt-get >/dev/null || die "no apt-get here: install $* by hand"
    apt_update_once
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    say "installed $*"
}

docker_answers() { docker info >/dev/null 2>&1; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# pycli's package for the machine's python3 below: the checkout's, or where this script is
# pycli/_project/scripts/ in an installed wheel, the folder that holds the installed pycli.
if [ -d "$ROOT/pycli" ]; then PYCLI_PATH=$ROOT; else PYCLI_PATH=$(cd "$ROOT/../.." && pwd); fi

# Room for local clusters of many nodes: each node's systemd takes inotify instances and watches
# of root's, and the kernel's default (128 instances) stops the twentieth node or so. The values
# and why: pycli/local/host_limits.py (standard library only, so the machine's python3 reads them).
raise_inotify_limits() {
    local file changed=0 name want have
    file=$(PYTHONPATH="$PYCLI_PATH" python3 -c 'from pycli.local.host_limits import HOST_SYSCTL_FILE; print(HOST_SYSCTL_FILE)')
    # /proc/sys itself rather than sysctl(8), which a minimal machine may not have (procps).
    while read -r name want; do
        have=$(cat "/proc/sys/${name//.//}")
        if [ "$have" -lt "$want" ]; then
            need_root "raising $name"
            if printf '%s\n' "$want" 2>/dev/null > "/proc/sys/${name//.//}"; then
                changed=1
                say "raised $name from $have to $want"
            else
                # A machine that does not let it be raised (a container): cluster up checks
                # before it starts nodes and says what a cluster of that size needs.
                say "could not raise $name from $have to $want here; 'pycli cluster up' says when a cluster needs more"
            fi
        fi
    done < <(PYTHONPATH="$PYCLI_PATH" python3 -c 'from pycli.local.host_limits import RAISED; [print(k, v) for k, v in RAISED.items()]')
    if [ "$changed" -eq 1 ] || [ ! -f "$file" ]; then
        need_root "writing $file"
        PYTHONPATH="$PYCLI_PATH" python3 -c 'from pycli.local.host_limits import sysctl_file_text; print(sysctl_file_text(), end="")' > "$file"
        say "wrote $file (the limits stay raised after a reboot)"
    else
        say "inotify limits allow local clusters of many nodes"
    fi
}
raise_inotify_limits

# dockerd from a distribution package; the docker CLI alone (no engine) is common.
if ! command -v dockerd >/dev/null; then
    apt_install docker.io
else
    say "dockerd present ($(dockerd --version 2>/dev/null | head -1))"
fi

if ! command -v debootstrap >/dev/null; then
    apt_install debootstrap
else
    say "debootstrap present"
fi

# The tests run `pycli top` in a real terminal: tmux gives them one and reads its screen back.
if ! command -v tmux >/dev/null; then
    apt_install tmux
else
    say "tmux present"
fi

# pycli runs debootstrap with --keyring set to Debian's archive keyring, so that it checks
# the signatures of what it installs; Ubuntu's debootstrap does not bring that keyring.
if [ ! -f /usr/share/keyrings/debian-archive-keyring.gpg ]; then
    apt_install debian-archive-keyring
else
    say "debian-archive-keyring present"
fi

# promtool alone, taken out of the distribution's prometheus package: installing that package
# would also install and start a Prometheus server. apt-get download checks the package as
# apt-get install does (the archive's signed index and the file's hash).
install_promtool() {
    need_root "installing promtool"
    command -v apt-get >/dev/null || die "no apt-get here: put promtool (Prometheus 2.x) on PATH by hand"
    if ! apt-cache show prometheus >/dev/null 2>&1; then
        apt_update_once
    fi
    local deb
    promtool_tmp=$(mktemp -d)
    trap 'rm -rf "$promtool_tmp"' EXIT
    # apt downloads as its sandbox user _apt where one exists; let it write here.
    chown _apt "$promtool_tmp" 2>/dev/null || true
    (cd "$promtool_tmp" && apt-get download -qq prometheus >/dev/null) ||
        die "apt-get download prometheus failed; see above"
    deb=$(ls "$promtool_tmp"/prometheus_*.deb)
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$promtool_tmp" ./usr/bin/promtool
    install -m 0755 "$promtool_tmp/usr/bin/promtool" /usr/local/bin/promtool
    rm -rf "$promtool_tmp"
    trap - EXIT
    say "installed /usr/local/bin/promtool from $(basename "$deb") ($(promtool --version 2>&1 | head -1))"
}

if ! command -v promtool >/dev/null; then
    install_promtool
else
    say "promtool present ($(promtool --version 2>&1 | head -1))"
fi

if docker_answers; then
    say "docker engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
fi

need_root "starting dockerd"
if command -v systemctl >/dev/null && [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then
    systemctl start docker && say "started docker.service"
else
    # No init system to ask (a container or a CI sandbox): start the daemon ourselves.
    log=/var/log/pycli-dockerd.log
    nohup setsid dockerd >"$log" 2>&1 </dev/null &
    say "started dockerd in the background (pid $!, log $log)"
fi

for _ in $(seq 1 60); do
    docker_answers && { say "docker engine answers ($(docker version --format '{{.Server.Version}}'))"; exit 0; }
    sleep 1
done
die "dockerd did not answer within 60 s; see /var/log/pycli-dockerd.log"
