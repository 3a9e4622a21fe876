#!/usr/bin/env bash
# Local services of the production profile: Apache Kafka (KRaft, one combined node), Redis (Feast
# online store) and the MLflow tracking server. Loopback only, no docker, no systemd, no manual step.
#
#   deploy/services.sh up      start what is not running, then health-check all three (idempotent)
#   deploy/services.sh down    stop them (by pid file; stale pid files are cleaned)
#   deploy/services.sh status  show pid, health, URL and log of each; exit 3 if any is not healthy
#   deploy/services.sh stop S  stop one service (kafka, redis or mlflow); `up` starts it again
#   deploy/services.sh env     print the exports: the config's own names for the three addresses
#                              (CTR_KAFKA_BOOTSTRAP_SERVERS, CTR_DAEMON_REDIS_URL,
#                              CTR_REGISTRY_TRACKING_URI) and PATH += deploy/kafka/bin (Kafka's CLI);
#                              use: eval "$(deploy/services.sh env)"
#   deploy/services.sh tools   fetch the class path of Kafka's CLI (deploy/kafka-cli.sh; up does it)
#
# Environment (defaults in brackets; ports are off the usual ones so a system Kafka/Redis/MLflow
# on the same machine does not clash):
#   CTR_KAFKA_PORT [19092]  CTR_KAFKA_CONTROLLER_PORT [19093]  CTR_REDIS_PORT [16379]
#   CTR_MLFLOW_PORT [15000]  CTR_MLFLOW_WORKERS [2]  CTR_KAFKA_VERSION [4.1.1]
#   CTR_KAFKA_HEAP ["-Xms256m -Xmx1g"]  CTR_KAFKA_LOG_LEVEL [info]  CTR_REDIS_PERSIST [0]
#   CTR_MLFLOW_JOBS [0]: 1 runs MLflow's job runner (GenAI scoring jobs; ~8 extra processes)
#   CTR_CACHE [~/.cache/ctr-online]: Kafka jars (kafka-<version>/libs, the CLI's in tools-libs) and
#     the Maven repo (m2)
#   CTR_STATE [$CTR_CACHE/state]: data, logs, pid files, services.env
#   CTR_VENV [from deploy/venv.sh]: the Python environment (mlflow, kafka-python)
#   CTR_SERVICES_TIMEOUT [180]: seconds to wait for each service to become healthy
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${CTR_CACHE:-$HOME/.cache/ctr-online}"
STATE="${CTR_STATE:-$CACHE/state}"
KAFKA_VERSION="${CTR_KAFKA_VERSION:-4.1.1}"
KAFKA_PORT="${CTR_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${CTR_KAFKA_CONTROLLER_PORT:-19093}"
REDIS_PORT="${CTR_REDIS_PORT:-16379}"
MLFLOW_PORT="${CTR_MLFLOW_PORT:-15000}"
MLFLOW_WORKERS="${CTR_MLFLOW_WORKERS:-2}"
KAFKA_HEAP="${CTR_KAFKA_HEAP:--Xms256m -Xmx1g}"
TIMEOUT="${CTR_SERVICES_TIMEOUT:-180}"
export MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true

KAFKA_LIBS="$CACHE/kafka-$KAFKA_VERSION/libs"
KAFKA_TOOLS_LIBS="$CACHE/kafka-$KAFKA_VERSION/tools-libs"
KAFKA_DIR="$STATE/kafka"
KAFKA_PROPS="$KAFKA_DIR/server.properties"
KAFKA_LOG="$KAFKA_DIR/logs/server.log"
KAFKA_OUT="$KAFKA_DIR/logs/kafka.out"
KAFKA_PID="$KAFKA_DIR/kafka.pid"
REDIS_DIR="$STATE/redis"
REDIS_LOG="$REDIS_DIR/redis.log"
REDIS_PID="$REDIS_DIR/redis.pid"
MLFLOW_DIR="$STATE/mlflow"
MLFLOW_LOG="$MLFLOW_DIR/mlflow.log"
MLFLOW_PID="$MLFLOW_DIR/mlflow.pid"
ENV_FILE="$STATE/services.env"
STARTED=()
KAFKA_JVM=()

KAFKA_BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
MLFLOW_URI="http://127.0.0.1:$MLFLOW_PORT"

log() { printf 'services: %s\n' "$*" >&2; }
die() {
  printf 'services: ERROR: %s\n' "$*" >&2
  exit 1
}

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
  exit "${1:-2}"
}

check_ports() {
  local name value
  for name in KAFKA_PORT KAFKA_CONTROLLER_PORT REDIS_PORT MLFLOW_PORT; do
    value="${!name}"
    [[ "$value" =~ ^[0-9]+$ ]] && ((value > 0 && value < 65536)) ||
      die "CTR_$name='$value' is not a TCP port number"
  done
  local all="$KAFKA_PORT $KAFKA_CONTROLLER_PORT $REDIS_PORT $MLFLOW_PORT"
  [ "$(tr ' ' '\n' <<<"$all" | sort -u | wc -l)" = 4 ] ||
    die "the four ports must differ (kafka $KAFKA_PORT, controller $KAFKA_CONTROLLER_PORT, redis $REDIS_PORT, mlflow $MLFLOW_PORT)"
}

# ---------------------------------------------------------------------------------------------
# helpers: python env, ports, pid files
# ---------------------------------------------------------------------------------------------
VENV_DIR=""
venv() {
  if [ -z "$VENV_DIR" ]; then
    if [ -n "${CTR_VENV:-}" ]; then
      VENV_DIR="$CTR_VENV"
    else
      VENV_DIR="$("$here/deploy/venv.sh")" || die "could not create the Python environment (deploy/venv.sh); set CTR_VENV to an environment with mlflow and kafka-python"
    fi
    [ -x "$VENV_DIR/bin/python" ] || die "CTR_VENV=$VENV_DIR has no bin/python"
  fi
  printf '%s\n' "$VENV_DIR"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pid_of PIDFILE MARKER: print the pid if the process is alive and its command line has MARKER
pid_of() {
  local file="$1" marker="$2" pid
  [ -f "$file" ] || return 1
  pid="$(cat "$file" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  local cmdline
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$cmdline" == *"$marker"* ]] || return 1
  printf '%s\n' "$pid"
}

clean_stale() {
  local name="$1" file="$2" marker="$3"
  if [ -f "$file" ] && ! pid_of "$file" "$marker" >/dev/null; then
    log "$name: removing stale pid file $file (pid $(cat "$file" 2>/dev/null || echo '?') is gone)"
    rm -f "$file" "$file.ports"
  fi
}

# launch PIDFILE OUTFILE CMD...: start CMD in its own session (so it outlives make/pytest and its
# whole process tree can be stopped at once), detached from the terminal
launch() {
  local pidfile="$1" out="$2"
  shift 2
  mkdir -p "$(dirname "$out")"
  printf '\n==== %s start: %s\n' "$(date -Is)" "$*" >>"$out"
  setsid "$@" </dev/null >>"$out" 2>&1 9>&- & # 9>&-: the child must not inherit the up lock
  printf '%s\n' "$!" >"$pidfile"
}

# wait_healthy NAME PIDFILE MARKER LOG CHECK...: poll CHECK until it passes, the process dies or
# the timeout passes
wait_healthy() {
  local name="$1" pidfile="$2" marker="$3" logfile="$4"
  shift 4
  local deadline=$((SECONDS + TIMEOUT))
  while :; do
    if ! pid_of "$pidfile" "$marker" >/dev/null; then
      log "$name exited while starting; last lines of $logfile:"
      tail -n 25 "$logfile" >&2 || true
      rm -f "$pidfile" "$pidfile.ports"
      die "$name did not start; full log: $logfile"
    fi
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    if ((SECONDS >= deadline)); then
      log "$name: last lines of $logfile:"
      tail -n 25 "$logfile" >&2 || true
      die "$name (pid $(cat "$pidfile")) is not healthy after ${TIMEOUT}s; log: $logfile. Try: deploy/services.sh down && deploy/services.sh up (or raise CTR_SERVICES_TIMEOUT)"
    fi
    sleep 0.5
  done
}

stop_pid() {
  local name="$1" pidfile="$2" marker="$3" pid i
  if ! pid="$(pid_of "$pidfile" "$marker")"; then
    clean_stale "$name" "$pidfile" "$marker"
    log "$name: not running"
    return 0
  fi
  log "$name: stopping pid $pid"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do
    kill -0 -- "-$pid" 2>/dev/null || kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 -- "-$pid" 2>/dev/null || kill -0 "$pid" 2>/dev/null; then
    log "$name: still running after 30s, sending KILL"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$pidfile" "$pidfile.ports"
  log "$name: stopped"
}

# a running instance must listen where this call's environment says, or the health check would
# wait for nothing: refuse early and say how to move it
already_running() {
  local name="$1" pidfile="$2" want="$3" var="$4" have
  have="$(cat "$pidfile.ports" 2>/dev/null || echo "$want")"
  [ "$have" = "$want" ] ||
    die "$name is running (pid $(cat "$pidfile")) on port(s) $have, but $var ask(s) for $want; run 'deploy/services.sh down' first (with the old ports in the environment), then up"
  log "$name: already running (pid $(cat "$pidfile")), checking health"
}

refuse_foreign_port() {
  local name="$1" port="$2" var="$3"
  if port_open "$port"; then
    local who
    who="$(ss -Hltnp "sport = :$port" 2>/dev/null | head -n 3 || true)"
    die "$name: port $port on 127.0.0.1 is already in use by another process (${who:-unknown}); stop it or choose another port with $var=..."
  fi
}

# ---------------------------------------------------------------------------------------------
# Kafka
# ---------------------------------------------------------------------------------------------
kafka_marker() { printf '%s\n' "$KAFKA_PROPS"; }

kafka_healthy() {
  port_open "$KAFKA_PORT" || return 1
  timeout 30 "$(venv)/bin/python" -W ignore - "$KAFKA_BOOTSTRAP" <<'EOF'
import sys

from kafka import KafkaAdminClient

admin = KafkaAdminClient(bootstrap_servers=sys.argv[1], bootstrap_timeout_ms=5000, request_timeout_ms=5000)
try:
    admin.list_topics()
finally:
    admin.close()
EOF
}

check_java() {
  command -v java >/dev/null || die "java is missing: Kafka $KAFKA_VERSION needs Java 17+ (apt-get install -y openjdk-17-jre-headless)"
  local v
  v="$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
  [[ "${v%%.*}" =~ ^[0-9]+$ ]] && ((${v%%.*} >= 17)) ||
    die "Kafka $KAFKA_VERSION needs Java 17 or newer; 'java' is version '${v:-unknown}'"
}

# maven_libs WHAT POM DEST JAR: copy POM's runtime class path (Kafka $KAFKA_VERSION) from Maven
# Central into DEST once; DEST/.complete holds a hash of the pom and the version, so a changed pom or
# version fetches again. JAR (a glob) must be among what came. Parallel callers wait on DEST.lock.
maven_libs() {
  local what="$1" pom="$2" dest="$3" jar="$4" stamp
  stamp="$( (cat "$pom"; echo "$KAFKA_VERSION") | sha256sum | cut -c1-16)"
  if [ -f "$dest/.complete" ] && [ "$(cat "$dest/.complete")" = "$stamp" ]; then
    return 0
  fi
  mkdir -p "$CACHE/kafka-$KAFKA_VERSION"
  exec 8>"$dest.lock"
  flock -w 900 8 || die "another process holds $dest.lock for more than 900s"
  if [ -f "$dest/.complete" ] && [ "$(cat "$dest/.complete")" = "$stamp" ]; then
    exec 8>&-
    return 0
  fi
  command -v mvn >/dev/null || die "mvn is missing: it fetches Kafka from Maven Central (apt-get install -y maven)"
  local mvnlog="$dest.maven.log"
  log "kafka: fetching $what $KAFKA_VERSION and its dependencies from Maven Central into $dest (once)"
  rm -rf "$dest.tmp"
  if ! mvn -B -q -Dstyle.color=never -f "$pom" -Dkafka.version="$KAFKA_VERSION" \
    -Dmaven.repo.local="$CACHE/m2" dependency:copy-dependencies \
    -DoutputDirectory="$dest.tmp" >"$mvnlog" 2>&1; then
    tail -n 20 "$mvnlog" >&2 || true
    die "maven could not fetch $what $KAFKA_VERSION (network to Maven Central? wrong CTR_KAFKA_VERSION?); log: $mvnlog"
  fi
  compgen -G "$dest.tmp/$jar" >/dev/null || die "maven ran but no $jar landed in $dest.tmp; log: $mvnlog"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
  printf '%s\n' "$stamp" >"$dest/.complete"
  exec 8>&-
}

kafka_libs() {
  maven_libs org.apache.kafka:kafka_2.13 "$here/deploy/kafka/pom.xml" "$KAFKA_LIBS" 'kafka_2.13-*.jar'
}

# Kafka's CLI (kafka-topics, kafka-console-consumer, ...): its own class path, so that fetching it
# never replaces the jars under a running broker
kafka_tools_libs() {
  maven_libs org.apache.kafka:kafka-tools "$here/deploy/kafka/tools-pom.xml" "$KAFKA_TOOLS_LIBS" 'kafka-tools-*.jar'
}

kafka_jvm() {
  local heap
  read -r -a heap <<<"$KAFKA_HEAP"
  KAFKA_JVM=(java "${heap[@]}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" -Dkafka.logs.dir="$KAFKA_DIR/logs"
    -Dctr.kafka.log.level="${CTR_KAFKA_LOG_LEVEL:-info}" -cp "$KAFKA_LIBS/*")
}

kafka_render_props() {
  sed -e "s#@KAFKA_PORT@#$KAFKA_PORT#g" -e "s#@KAFKA_CONTROLLER_PORT@#$KAFKA_CONTROLLER_PORT#g" \
    -e "s#@KAFKA_DATA_DIR@#$KAFKA_DIR/data#g" "$here/deploy/kafka/server.properties"
}

kafka_start() {
  clean_stale kafka "$KAFKA_PID" "$(kafka_marker)"
  if pid_of "$KAFKA_PID" "$(kafka_marker)" >/dev/null; then
    already_running kafka "$KAFKA_PID" "$KAFKA_PORT $KAFKA_CONTROLLER_PORT" CTR_KAFKA_PORT/CTR_KAFKA_CONTROLLER_PORT
    # a broker started before deploy/kafka/server.properties changed keeps its old settings
    kafka_render_props | cmp -s - "$KAFKA_PROPS" ||
      log "kafka: WARNING: the running broker was started with an older deploy/kafka/server.properties; to apply it: deploy/services.sh stop kafka && deploy/services.sh up"
    return 0
  fi
  refuse_foreign_port kafka "$KAFKA_PORT" CTR_KAFKA_PORT
  refuse_foreign_port kafka-controller "$KAFKA_CONTROLLER_PORT" CTR_KAFKA_CONTROLLER_PORT
  check_java
  kafka_libs
  mkdir -p "$KAFKA_DIR/data" "$KAFKA_DIR/logs"
  kafka_jvm
  kafka_render_props >"$KAFKA_PROPS"
  cp "$here/deploy/kafka/log4j2.properties" "$KAFKA_DIR/log4j2.properties"
  if [ ! -f "$KAFKA_DIR/data/meta.properties" ]; then
    local cid
    cid="$("${KAFKA_JVM[@]}" kafka.tools.StorageTool random-uuid 2>>"$KAFKA_OUT")" || die "kafka: could not make a cluster id; log: $KAFKA_OUT"
    log "kafka: formatting storage $KAFKA_DIR/data (cluster id $cid)"
    "${KAFKA_JVM[@]}" kafka.tools.StorageTool format -t "$cid" -c "$KAFKA_PROPS" >>"$KAFKA_OUT" 2>&1 ||
      die "kafka: formatting $KAFKA_DIR/data failed; log: $KAFKA_OUT (delete $KAFKA_DIR/data to start from scratch)"
  fi
  STARTED+=(kafka)
  log "kafka: starting $KAFKA_VERSION on $KAFKA_BOOTSTRAP (controller 127.0.0.1:$KAFKA_CONTROLLER_PORT); log: $KAFKA_LOG"
  launch "$KAFKA_PID" "$KAFKA_OUT" "${KAFKA_JVM[@]}" kafka.Kafka "$KAFKA_PROPS"
  printf '%s\n' "$KAFKA_PORT $KAFKA_CONTROLLER_PORT" >"$KAFKA_PID.ports"
}

kafka_wait() { wait_healthy kafka "$KAFKA_PID" "$(kafka_marker)" "$KAFKA_LOG" kafka_healthy; }

# ---------------------------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------------------------
redis_marker() { printf 'redis-server\n'; }

redis_healthy() { [ "$(timeout 5 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }

redis_install() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return 0
  command -v apt-get >/dev/null || die "redis-server is missing and there is no apt-get: install Redis 6+ and put redis-server and redis-cli on PATH"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
      die "redis-server is missing; install it once with: sudo apt-get install -y redis-server"
    sudo="sudo -n"
  fi
  local aptlog="$STATE/apt-redis.log"
  mkdir -p "$STATE"
  log "redis: redis-server is missing, installing it from Debian (apt-get install redis-server); log: $aptlog"
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo apt-get install -y -q --no-install-recommends redis-server >"$aptlog" 2>&1; then
    log "redis: install failed, running apt-get update and retrying"
    $sudo apt-get update -q >>"$aptlog" 2>&1 || die "apt-get update failed; log: $aptlog"
    $sudo apt-get install -y -q --no-install-recommends redis-server >>"$aptlog" 2>&1 ||
      die "apt-get install redis-server failed; log: $aptlog"
  fi
  command -v redis-server >/dev/null || die "redis-server is still not on PATH after apt-get; log: $aptlog"
}

redis_start() {
  clean_stale redis "$REDIS_PID" "$(redis_marker)"
  if pid_of "$REDIS_PID" "$(redis_marker)" >/dev/null; then
    already_running redis "$REDIS_PID" "$REDIS_PORT" CTR_REDIS_PORT
    return 0
  fi
  refuse_foreign_port redis "$REDIS_PORT" CTR_REDIS_PORT
  redis_install
  mkdir -p "$REDIS_DIR"
  local save=(--save "" --appendonly no)
  [ "${CTR_REDIS_PERSIST:-0}" = 1 ] && save=(--save "300 1" --appendonly no --dbfilename dump.rdb)
  STARTED+=(redis)
  log "redis: starting on 127.0.0.1:$REDIS_PORT ($([ "${CTR_REDIS_PERSIST:-0}" = 1 ] && echo 'RDB snapshots' || echo 'no persistence')); log: $REDIS_LOG"
  printf '%s\n' "$REDIS_PORT" >"$REDIS_PID.ports"
  launch "$REDIS_PID" "$REDIS_LOG" redis-server --bind 127.0.0.1 --port "$REDIS_PORT" \
    --protected-mode yes --daemonize no --dir "$REDIS_DIR" --logfile "" "${save[@]}"
}

redis_wait() { wait_healthy redis "$REDIS_PID" "$(redis_marker)" "$REDIS_LOG" redis_healthy; }

# ---------------------------------------------------------------------------------------------
# MLflow tracking server
# ---------------------------------------------------------------------------------------------
mlflow_marker() { printf '%s\n' "$MLFLOW_DIR/mlflow.db"; }

mlflow_healthy() { [ "$(curl -fsS --max-time 3 "$MLFLOW_URI/health" 2>/dev/null)" = OK ]; }

mlflow_start() {
  clean_stale mlflow "$MLFLOW_PID" "$(mlflow_marker)"
  if pid_of "$MLFLOW_PID" "$(mlflow_marker)" >/dev/null; then
    already_running mlflow "$MLFLOW_PID" "$MLFLOW_PORT" CTR_MLFLOW_PORT
    return 0
  fi
  refuse_foreign_port mlflow "$MLFLOW_PORT" CTR_MLFLOW_PORT
  command -v curl >/dev/null || die "curl is missing (the MLflow health check uses it): apt-get install -y curl"
  local mlflow
  mlflow="$(venv)/bin/mlflow"
  [ -x "$mlflow" ] || die "no mlflow in $(venv); run deploy/venv.sh or set CTR_VENV"
  mkdir -p "$MLFLOW_DIR/artifacts"
  STARTED+=(mlflow)
  log "mlflow: starting tracking server on $MLFLOW_URI (store $MLFLOW_DIR); log: $MLFLOW_LOG"
  printf '%s\n' "$MLFLOW_PORT" >"$MLFLOW_PID.ports"
  # MLflow's job runner (GenAI scoring / trace archival: 1 + 7 huey processes, ~2 GB) is not used
  # here; CTR_MLFLOW_JOBS=1 turns it back on
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION="$([ "${CTR_MLFLOW_JOBS:-0}" = 1 ] && echo true || echo false)" \
  launch "$MLFLOW_PID" "$MLFLOW_LOG" "$mlflow" server \
    --backend-store-uri "sqlite:///$MLFLOW_DIR/mlflow.db" \
    --serve-artifacts --artifacts-destination "$MLFLOW_DIR/artifacts" \
    --host 127.0.0.1 --port "$MLFLOW_PORT" --workers "$MLFLOW_WORKERS" \
    --allowed-hosts "localhost,localhost:*,127.0.0.1,127.0.0.1:*" \
    --uvicorn-opts "--no-access-log"
}

mlflow_wait() { wait_healthy mlflow "$MLFLOW_PID" "$(mlflow_marker)" "$MLFLOW_LOG" mlflow_healthy; }

# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
# the names pipeline/core/config.py reads (CTR_<SECTION>_<FIELD>: kafka.bootstrap_servers,
# daemon.redis_url, registry.tracking_uri), so `ctr` and the tests in this shell use these services;
# PATH gets Kafka's own CLI (deploy/kafka/bin/kafka-topics.sh, ...)
print_env() {
  cat <<EOF
export CTR_KAFKA_BOOTSTRAP_SERVERS=$KAFKA_BOOTSTRAP
export CTR_DAEMON_REDIS_URL=$REDIS_URL
export CTR_REGISTRY_TRACKING_URI=$MLFLOW_URI
export PATH="$here/deploy/kafka/bin:\$PATH"
EOF
}

cmd_up() {
  local t0=$SECONDS svc
  venv >/dev/null # resolve once, in this shell (the health checks run in subshells)
  mkdir -p "$STATE"
  exec 9>"$STATE/.services.lock"
  flock -w "$TIMEOUT" 9 || die "another 'deploy/services.sh' holds $STATE/.services.lock for more than ${TIMEOUT}s"
  # launch what is not running (they start in parallel), then wait for all three to be healthy
  # preflight: the ports of every service that is not running yet must be free, before anything starts
  pid_of "$KAFKA_PID" "$(kafka_marker)" >/dev/null || {
    refuse_foreign_port kafka "$KAFKA_PORT" CTR_KAFKA_PORT
    refuse_foreign_port kafka-controller "$KAFKA_CONTROLLER_PORT" CTR_KAFKA_CONTROLLER_PORT
  }
  pid_of "$REDIS_PID" "$(redis_marker)" >/dev/null || refuse_foreign_port redis "$REDIS_PORT" CTR_REDIS_PORT
  pid_of "$MLFLOW_PID" "$(mlflow_marker)" >/dev/null || refuse_foreign_port mlflow "$MLFLOW_PORT" CTR_MLFLOW_PORT
  kafka_start
  redis_start
  mlflow_start
  kafka_tools_libs # while the services start (a no-op once fetched)
  for svc in kafka redis mlflow; do
    "${svc}_wait"
    log "$svc: healthy"
  done
  print_env >"$ENV_FILE"
  log "up in $((SECONDS - t0))s (started: ${STARTED[*]:-none}); urls in $ENV_FILE:"
  sed 's/^/  /' "$ENV_FILE" >&2
}

cmd_down() {
  stop_pid mlflow "$MLFLOW_PID" "$(mlflow_marker)"
  stop_pid redis "$REDIS_PID" "$(redis_marker)"
  stop_pid kafka "$KAFKA_PID" "$(kafka_marker)"
}

cmd_status() {
  local bad=0 name pidfile marker logfile url pid health
  venv >/dev/null
  while IFS='|' read -r name pidfile marker logfile url; do
    if pid="$(pid_of "$pidfile" "$marker")"; then
      if "${name}_healthy" >/dev/null 2>&1; then health=healthy; else health=UNHEALTHY bad=1; fi
      printf '%-7s %-9s pid %-8s %-26s log %s\n' "$name" "$health" "$pid" "$url" "$logfile"
    else
      bad=1
      [ -f "$pidfile" ] && health="stopped (stale pid file)" || health=stopped
      printf '%-7s %-9s %-39s log %s\n' "$name" "$health" "$url" "$logfile"
    fi
  done <<EOF
kafka|$KAFKA_PID|$(kafka_marker)|$KAFKA_LOG|$KAFKA_BOOTSTRAP
redis|$REDIS_PID|$(redis_marker)|$REDIS_LOG|$REDIS_URL
mlflow|$MLFLOW_PID|$(mlflow_marker)|$MLFLOW_LOG|$MLFLOW_URI
EOF
  return $((bad ? 3 : 0))
}

cmd_stop() {
  case "$1" in
    kafka) stop_pid kafka "$KAFKA_PID" "$(kafka_marker)" ;;
    redis) stop_pid redis "$REDIS_PID" "$(redis_marker)" ;;
    mlflow) stop_pid mlflow "$MLFLOW_PID" "$(mlflow_marker)" ;;
    *) die "stop: unknown service '$1'; expected kafka, redis or mlflow" ;;
  esac
}

if [ "${1:-}" = stop ]; then
  [ $# -eq 2 ] || die "usage: deploy/services.sh stop kafka|redis|mlflow"
  cmd_stop "$2"
  exit 0
fi
[ $# -eq 1 ] || usage
check_ports
case "$1" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) print_env ;;
  tools) kafka_tools_libs ;;
  -h | --help | help) usage 0 ;;
  *) usage ;;
esac
