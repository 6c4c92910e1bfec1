#!/usr/bin/env bash
# scripts/services.sh: make sure the services Wharf's tests need are up.
#
#   PostgreSQL  WHARF_TEST_PG_URL    (default postgres://postgres@127.0.0.1:5432/test)
#   Mosquitto   WHARF_TEST_MQTT_URL  (default mqtt://127.0.0.1:1883), and the
#               `mosquitto` binary on PATH (tests start brokers of their own).
#
# It checks first and only fixes what is missing. For a service on this host it
# will start an installed but stopped server, install the Debian packages if
# they are absent, give localhost TCP clients passwordless (trust) access to
# PostgreSQL and create the test database. That needs root, or sudo.
# Every service is then waited for; if one is still not usable when the
# deadline passes, the script fails and names it. It never skips a service.
#
# Settings (environment):
#   WHARF_NO_PROVISION=1       check only: install, start or reconfigure nothing
#   WHARF_SERVICES_TIMEOUT=N   seconds to wait for each service (default 60)
#
# Run it (the exit status tells whether everything is up), or source it from
# bash: it then returns that status and leaves PATH and the WHARF_TEST_*_URL
# variables exported in the calling shell. The code below does its own error
# handling, so it behaves the same whether or not the caller uses `set -e`.

WHARF_TEST_PG_URL=${WHARF_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/test}
WHARF_TEST_MQTT_URL=${WHARF_TEST_MQTT_URL:-mqtt://127.0.0.1:1883}
export WHARF_TEST_PG_URL WHARF_TEST_MQTT_URL

_WHARF_APT_UPDATED=0

_wharf_log() { printf 'services: %s\n' "$*"; }
_wharf_err() { printf 'services: ERROR: %s\n' "$*" >&2; }

_wharf_provisioning() { [[ ${WHARF_NO_PROVISION:-0} != 1 ]]; }

_wharf_is_local() {
  case $1 in 127.0.0.1 | localhost | ::1 | '[::1]') return 0 ;; *) return 1 ;; esac
}

# Hide a password in a URL before printing it.
_wharf_redact() { sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

# Run a command as root: directly if we are root, otherwise through sudo.
_wharf_as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    _wharf_err "need root to run '$*', and sudo is not available"
    return 1
  fi
}

# apt-get install, running `apt-get update` once per invocation first.
_wharf_apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    _wharf_err "apt-get not found: install $* by hand"
    return 1
  fi
  _wharf_log "installing $* with apt-get"
  if [[ $_WHARF_APT_UPDATED -eq 0 ]]; then
    _wharf_as_root apt-get update -q || return 1
    _WHARF_APT_UPDATED=1
  fi
  _wharf_as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "$@"
}

# Split a URL of the form scheme://[user[:pass]@]host[:port][/path][?query]
# into the globals _u_scheme _u_userinfo _u_host _u_port _u_path _u_query.
_wharf_parse_url() {
  local re='^([A-Za-z][A-Za-z0-9+.-]*)://(([^@/]*)@)?([^:/?#]+)(:([0-9]+))?(/([^?#]*))?(\?[^#]*)?$'
  if [[ ! $1 =~ $re ]]; then
    _wharf_err "cannot parse URL '$(_wharf_redact "$1")'"
    return 1
  fi
  _u_scheme=${BASH_REMATCH[1]}
  _u_userinfo=${BASH_REMATCH[3]}
  _u_host=${BASH_REMATCH[4]}
  _u_port=${BASH_REMATCH[6]}
  _u_path=${BASH_REMATCH[8]}
  _u_query=${BASH_REMATCH[9]}
}

# Poll "$@" once a second until it succeeds or the deadline passes.
_wharf_wait_for() {
  local what=$1
  shift
  local timeout=${WHARF_SERVICES_TIMEOUT:-60}
  local deadline=$((SECONDS + timeout))
  "$@" && return 0
  _wharf_log "waiting up to ${timeout}s for $what"
  while ((SECONDS < deadline)); do
    sleep 1
    "$@" && return 0
  done
  _wharf_err "$what is still not reachable after ${timeout}s"
  return 1
}

# True if something accepts TCP connections on host $1, port $2.
_wharf_tcp_open() {
  # shellcheck disable=SC2016 # $0/$1 expand in the child bash, on purpose
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
}

# ---------------------------------------------------------------- PostgreSQL

# Debian's psql is a wrapper that fails when no client version is installed,
# so try running it rather than just looking for it.
_wharf_pg_client_ok() {
  command -v pg_isready >/dev/null 2>&1 && psql --version >/dev/null 2>&1
}

_wharf_pg_server_installed() {
  command -v pg_lsclusters >/dev/null 2>&1 && compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}

_wharf_pg_ready() { pg_isready -q -h "$1" -p "$2" -t 2 >/dev/null 2>&1; }

# Run SELECT 1 against URL $1; the output (or psql's error) lands in _wharf_psql_out.
_wharf_pg_select1() {
  _wharf_psql_out=$(PGCONNECT_TIMEOUT=5 psql "$1" -X -A -t -q -c 'SELECT 1' 2>&1)
  [[ $_wharf_psql_out == 1 ]]
}

# Start the local cluster listening on port $1 (creating one if the server is
# installed but has no cluster at all).
_wharf_pg_start_cluster() {
  local port=$1 clusters line ver name status
  clusters=$(pg_lsclusters -h 2>/dev/null || true)
  if [[ -z $clusters ]]; then
    ver=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort -V | tail -n 1)
    if [[ -z $ver ]]; then
      _wharf_err "no PostgreSQL server found under /usr/lib/postgresql"
      return 1
    fi
    _wharf_log "no PostgreSQL cluster exists: creating $ver/main on port $port"
    _wharf_as_root pg_createcluster --port "$port" "$ver" main || return 1
    clusters=$(pg_lsclusters -h 2>/dev/null || true)
  fi
  # Prefer the cluster configured for our port, else the newest "main".
  line=$(awk -v p="$port" '$3 == p' <<<"$clusters" | head -n 1)
  if [[ -z $line ]]; then
    line=$(awk '$2 == "main"' <<<"$clusters" | sort -V | tail -n 1)
  fi
  if [[ -z $line ]]; then
    _wharf_err "no PostgreSQL cluster to start (pg_lsclusters shows none)"
    return 1
  fi
  read -r ver name _ status _ <<<"$line"
  if [[ $status == online* ]]; then
    _wharf_log "cluster $ver/$name is already running (check its port and listen_addresses)"
    return 0
  fi
  _wharf_log "starting PostgreSQL cluster $ver/$name"
  _wharf_as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start
}

# Put trust rules for localhost TCP at the top of every local cluster's
# pg_hba.conf (the first matching rule wins) and reload the cluster.
_wharf_pg_trust_localhost() {
  local hba dir ver name tmp marker='# wharf scripts/services.sh: passwordless TCP from localhost for tests'
  for hba in /etc/postgresql/*/*/pg_hba.conf; do
    [[ -f $hba ]] || continue
    if _wharf_as_root grep -qxF "$marker" "$hba"; then
      continue
    fi
    _wharf_log "allowing trust auth from 127.0.0.1 and ::1 in $hba"
    tmp=$(mktemp) || return 1
    {
      printf '%s\n' "$marker" 'host all all 127.0.0.1/32 trust' 'host all all ::1/128 trust' ''
      _wharf_as_root cat "$hba"
    } >"$tmp" || { rm -f "$tmp"; return 1; }
    # cp onto the existing file keeps its owner and mode.
    _wharf_as_root cp "$tmp" "$hba" || { rm -f "$tmp"; return 1; }
    rm -f "$tmp"
    dir=${hba%/pg_hba.conf}
    name=${dir##*/}
    ver=${dir%/*}
    ver=${ver##*/}
    _wharf_as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" reload || true
  done
}

_wharf_ensure_postgres() {
  local url=$WHARF_TEST_PG_URL shown host port db admin_url
  shown=$(_wharf_redact "$url")
  _wharf_parse_url "$url" || return 1
  host=$_u_host port=${_u_port:-5432} db=$_u_path
  admin_url="$_u_scheme://${_u_userinfo:+$_u_userinfo@}$host${_u_port:+:$_u_port}/postgres$_u_query"

  # Client tools (psql, pg_isready).
  if ! _wharf_pg_client_ok; then
    if ! _wharf_provisioning; then
      _wharf_err "PostgreSQL: psql/pg_isready not found (install postgresql-client)"
      return 1
    fi
    if _wharf_is_local "$host" && ! _wharf_pg_server_installed; then
      _wharf_apt_install postgresql || return 1
    else
      _wharf_apt_install postgresql-client || return 1
    fi
  fi

  # The server itself.
  if ! _wharf_pg_ready "$host" "$port"; then
    if _wharf_provisioning && _wharf_is_local "$host"; then
      _wharf_log "PostgreSQL is not answering at $host:$port"
      if ! _wharf_pg_server_installed; then
        _wharf_apt_install postgresql || return 1
      fi
      # The package may already have started it; otherwise start it here.
      if ! _wharf_pg_ready "$host" "$port"; then
        _wharf_pg_start_cluster "$port" || return 1
      fi
    fi
    if ! _wharf_wait_for "PostgreSQL at $host:$port" _wharf_pg_ready "$host" "$port"; then
      _wharf_err "PostgreSQL is not running at $host:$port ($shown)"
      return 1
    fi
  fi

  # Login and the test database: fix auth or create the database if needed.
  if ! _wharf_pg_select1 "$url" && _wharf_provisioning && _wharf_is_local "$host"; then
    if ! _wharf_pg_select1 "$admin_url"; then
      _wharf_log "cannot log in to PostgreSQL: $_wharf_psql_out"
      _wharf_pg_trust_localhost || return 1
      _wharf_wait_for "PostgreSQL login at $host:$port" _wharf_pg_select1 "$admin_url" || true
    fi
    if [[ -n $db ]] && _wharf_pg_select1 "$admin_url"; then
      # Queries go in on stdin: psql only expands :'db' / :"db" there, not in -c.
      if [[ -z $(PGCONNECT_TIMEOUT=5 psql "$admin_url" -X -A -t -q -v db="$db" \
        <<<"SELECT 1 FROM pg_database WHERE datname = :'db'" 2>/dev/null) ]]; then
        _wharf_log "creating database $db"
        PGCONNECT_TIMEOUT=5 psql "$admin_url" -X -q -v ON_ERROR_STOP=1 -v db="$db" \
          <<<'CREATE DATABASE :"db"' || return 1
      fi
    fi
  fi
  if ! _wharf_pg_select1 "$url"; then
    _wharf_err "PostgreSQL: 'SELECT 1' failed on $shown: $_wharf_psql_out"
    return 1
  fi
  _wharf_log "PostgreSQL OK ($shown)"
}

# ----------------------------------------------------------------- Mosquitto

# Debian installs mosquitto in /usr/sbin, which a non-root PATH often lacks.
_wharf_mosquitto_on_path() {
  local d
  command -v mosquitto >/dev/null 2>&1 && return 0
  for d in /usr/sbin /usr/local/sbin /sbin; do
    if [[ -x $d/mosquitto ]]; then
      PATH=$PATH:$d
      export PATH
      return 0
    fi
  done
  return 1
}

_wharf_mosquitto_start() {
  local port=$1 conf=/etc/mosquitto/mosquitto.conf bin
  bin=$(command -v mosquitto) || return 1
  if [[ -f $conf ]]; then
    # The packaged config keeps its pid file in /run/mosquitto, which only
    # systemd would create.
    if getent passwd mosquitto >/dev/null 2>&1; then
      _wharf_as_root install -d -o mosquitto -g mosquitto /run/mosquitto || true
    else
      _wharf_as_root mkdir -p /run/mosquitto || true
    fi
    _wharf_log "starting mosquitto -d -c $conf"
    _wharf_as_root "$bin" -d -c "$conf"
  else
    _wharf_log "starting mosquitto -d -p $port (no $conf)"
    "$bin" -d -p "$port"
  fi
}

_wharf_ensure_mosquitto() {
  local url=$WHARF_TEST_MQTT_URL host port started=0 log=/var/log/mosquitto/mosquitto.log
  _wharf_parse_url "$url" || return 1
  host=$_u_host port=${_u_port:-1883}

  # The tests spawn their own brokers, so the binary has to be on PATH.
  if ! _wharf_mosquitto_on_path; then
    if ! _wharf_provisioning; then
      _wharf_err "Mosquitto: the mosquitto binary is not installed (apt-get install mosquitto)"
      return 1
    fi
    _wharf_apt_install mosquitto mosquitto-clients || return 1
    if ! _wharf_mosquitto_on_path; then
      _wharf_err "Mosquitto: installed, but no mosquitto binary found"
      return 1
    fi
  fi

  if ! _wharf_tcp_open "$host" "$port"; then
    if _wharf_provisioning && _wharf_is_local "$host"; then
      _wharf_log "Mosquitto is not answering at $host:$port"
      _wharf_mosquitto_start "$port" || true
      started=1
    fi
    if ! _wharf_wait_for "Mosquitto at $host:$port" _wharf_tcp_open "$host" "$port"; then
      _wharf_err "Mosquitto (MQTT broker) is not running at $host:$port ($url)"
      if [[ $started -eq 1 && -r $log ]]; then
        _wharf_err "last lines of $log:"
        tail -n 5 "$log" >&2
      fi
      return 1
    fi
  fi
  _wharf_log "Mosquitto OK ($url; binary $(command -v mosquitto))"
}

# Check (and if needed provision) every service; fail if any is not usable.
wharf_services_up() {
  local rc=0
  _wharf_ensure_postgres || rc=1
  _wharf_ensure_mosquitto || rc=1
  if [[ $rc -ne 0 ]]; then
    _wharf_err "test services are not ready (see the messages above)"
  fi
  return "$rc"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -uo pipefail
  wharf_services_up
  exit $?
else
  wharf_services_up
fi
