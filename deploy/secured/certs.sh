#!/usr/bin/env bash
# docker compose --profile secured: the CA, the broker's keystore and the admin client
# properties, made once in the `secured-secrets` volume with the JRE's keytool.
set -euo pipefail
: "${KAFKA_KEYSTORE_PASSWORD:?export KAFKA_KEYSTORE_PASSWORD before docker compose --profile secured up}" \
  "${KAFKA_ADMIN_PASSWORD:?export KAFKA_ADMIN_PASSWORD before docker compose --profile secured up}"
cd /secrets
[ -f .done ] && exit 0
pw="$KAFKA_KEYSTORE_PASSWORD"
keytool -genkeypair -alias ca -dname "CN=dlqapp compose CA" -keyalg RSA -keysize 2048 -validity 3650 -ext bc:c \
  -keystore ca.p12 -storetype PKCS12 -storepass "$pw"
keytool -exportcert -alias ca -rfc -keystore ca.p12 -storepass "$pw" -file ca.pem
keytool -genkeypair -alias broker -dname "CN=kafka-secured" -keyalg RSA -keysize 2048 -validity 3650 \
  -keystore broker.p12 -storetype PKCS12 -storepass "$pw"
keytool -certreq -alias broker -keystore broker.p12 -storepass "$pw" -file broker.csr
keytool -gencert -alias ca -keystore ca.p12 -storepass "$pw" -infile broker.csr -outfile broker.pem -rfc -validity 3650 \
  -ext "SAN=dns:kafka-secured,dns:localhost"
keytool -importcert -noprompt -alias ca -file ca.pem -keystore broker.p12 -storepass "$pw"
keytool -importcert -noprompt -alias broker -file broker.pem -keystore broker.p12 -storepass "$pw"
cat >admin.properties <<EOF
security.protocol=SASL_SSL
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$KAFKA_ADMIN_PASSWORD";
ssl.truststore.type=PEM
ssl.truststore.location=/secrets/ca.pem
EOF
rm -f broker.csr ca.p12
chown 1000 broker.p12 admin.properties ca.pem  # the Kafka image runs as uid 1000
chmod 600 broker.p12 admin.properties
touch .done
