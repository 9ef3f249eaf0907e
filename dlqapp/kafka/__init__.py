"""Adapters to Kafka: how clients connect (security, ACLs, access checks), the topics
(admin, topology), and Faust's transport as dlqapp needs it (faust_compat, delivery order,
offset watch)."""
