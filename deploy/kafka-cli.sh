#!/usr/bin/env bash
# Kafka's own command-line tools, from the official org.apache.kafka jars on Maven Central (the same
# version as the local broker: CTR_KAFKA_VERSION). `make services-up` fetches their class path; a
# first call without it fetches it too (deploy/services.sh tools).
#
#   deploy/kafka-cli.sh TOOL [ARGS...]   e.g. deploy/kafka-cli.sh kafka-topics --bootstrap-server 127.0.0.1:19092 --list
#   deploy/kafka/bin/TOOL.sh [ARGS...]   the same under the distribution's script names; on PATH after
#                                        eval "$(deploy/services.sh env)"
#   deploy/kafka-cli.sh --list           the tools and their main classes
#
# TOOL is a distribution script name, with or without ".sh": kafka-topics, kafka-console-producer,
# kafka-console-consumer, kafka-consumer-groups, kafka-get-offsets, kafka-configs, kafka-log-dirs,
# kafka-metadata-quorum, kafka-delete-records, or kafka-run-class CLASS (any main class). ARGS are the
# tool's own (--help lists them); they need --bootstrap-server like the real scripts.
#
# Environment: CTR_CACHE, CTR_KAFKA_VERSION (as deploy/services.sh); CTR_KAFKA_CLI_HEAP [-Xmx512m];
#   CTR_KAFKA_CLI_LOG_LEVEL [warn]: level of the tools' log lines (always on stderr)
set -euo pipefail

self="$(readlink -f "${BASH_SOURCE[0]}")"
here="$(cd "$(dirname "$self")/.." && pwd)"
CACHE="${CTR_CACHE:-$HOME/.cache/ctr-online}"
KAFKA_VERSION="${CTR_KAFKA_VERSION:-4.1.1}"
LIBS="$CACHE/kafka-$KAFKA_VERSION/tools-libs"

die() {
  printf 'kafka-cli: ERROR: %s\n' "$*" >&2
  exit 2
}

# tool name -> main class (as bin/<tool>.sh of the Kafka 4.x distribution)
main_class() {
  case "$1" in
    kafka-topics) echo org.apache.kafka.tools.TopicCommand ;;
    kafka-console-producer) echo org.apache.kafka.tools.ConsoleProducer ;;
    kafka-console-consumer) echo org.apache.kafka.tools.consumer.ConsoleConsumer ;;
    kafka-consumer-groups) echo org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
    kafka-get-offsets) echo org.apache.kafka.tools.GetOffsetShell ;;
    kafka-configs) echo kafka.admin.ConfigCommand ;;
    kafka-log-dirs) echo org.apache.kafka.tools.LogDirsCommand ;;
    kafka-metadata-quorum) echo org.apache.kafka.tools.MetadataQuorumCommand ;;
    kafka-delete-records) echo org.apache.kafka.tools.DeleteRecordsCommand ;;
    *) return 1 ;;
  esac
}
TOOLS=(kafka-topics kafka-console-producer kafka-console-consumer kafka-consumer-groups kafka-get-offsets
  kafka-configs kafka-log-dirs kafka-metadata-quorum kafka-delete-records)

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$self" >&2
  exit "${1:-2}"
}

# called as deploy/kafka/bin/<tool>.sh (a link to this script) or as kafka-cli.sh <tool>
tool="$(basename "$0")"
tool="${tool%.sh}"
if [ "$tool" = kafka-cli ]; then
  [ $# -ge 1 ] || usage
  tool="${1%.sh}"
  shift
fi
case "$tool" in
  -h | --help | help) usage 0 ;;
  --list)
    for t in "${TOOLS[@]}"; do printf '%-24s %s\n' "$t" "$(main_class "$t")"; done
    printf '%-24s %s\n' kafka-run-class "CLASS [ARGS...]"
    exit 0
    ;;
  kafka-run-class)
    [ $# -ge 1 ] || die "usage: kafka-run-class CLASS [ARGS...]"
    class="$1"
    shift
    ;;
  *)
    class="$(main_class "$tool")" || die "unknown tool '$tool'; known: ${TOOLS[*]} kafka-run-class (deploy/kafka-cli.sh --list)"
    ;;
esac

command -v java >/dev/null || die "java is missing: Kafka's tools need Java 17+ (apt-get install -y openjdk-17-jre-headless)"
if [ ! -f "$LIBS/.complete" ]; then
  "$here/deploy/services.sh" tools >&2 || die "could not fetch Kafka $KAFKA_VERSION's tools (deploy/services.sh tools)"
fi

read -r -a heap <<<"${CTR_KAFKA_CLI_HEAP:--Xmx512m}"
# short-lived client JVMs: the C1 compiler only and the serial collector start them ~2x faster
exec java "${heap[@]}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$here/deploy/kafka/tools-log4j2.properties" \
  -Dctr.kafka.cli.log.level="${CTR_KAFKA_CLI_LOG_LEVEL:-warn}" \
  -cp "$LIBS/*" "$class" "$@"
