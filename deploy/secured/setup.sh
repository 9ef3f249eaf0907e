#!/usr/bin/env bash
# docker compose --profile secured: the SCRAM user dlqapp and exactly the ACLs that
# `faust -A dlqapp acls` printed into /secrets/acls.txt, applied as the super user admin.
set -euo pipefail
: "${DLQ_KAFKA_SASL_PASSWORD:?export DLQ_KAFKA_SASL_PASSWORD before docker compose --profile secured up}"
bootstrap=kafka-secured:9094
config=/secrets/admin.properties
/opt/kafka/bin/kafka-configs.sh --bootstrap-server "$bootstrap" --command-config "$config" --alter \
  --add-config "SCRAM-SHA-512=[password=$DLQ_KAFKA_SASL_PASSWORD]" --entity-type users --entity-name dlqapp
while read -r line; do
  [ -z "$line" ] || /opt/kafka/bin/kafka-acls.sh --bootstrap-server "$bootstrap" --command-config "$config" $line
done </secrets/acls.txt
