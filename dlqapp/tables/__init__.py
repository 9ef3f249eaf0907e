"""Table durability: confirmed writes, running counters, retention, the RocksDB memory budget."""
