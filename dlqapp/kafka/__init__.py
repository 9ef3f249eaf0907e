"""Adapters to Kafka and Faust: topic checks and creation (admin), ACLs and access checks,
the door every consumed message goes through (records), and Faust's internals as dlqapp
needs them (faust_consumer, faust_producer, faust_tables; delivery order, offset watch)."""
