"""Adapters to Kafka that know nothing of Faust: how clients connect (`security`)."""
