from aiokafka.partitioner import DefaultPartitioner

from dlqapp.core.partitioning import owner_partition


def test_owner_partition_matches_kafkas_default_key_partitioner():
    partitions = list(range(6))
    for i in range(500):
        request_id = f"req-{i}"
        assert owner_partition(request_id, 6) == DefaultPartitioner()(request_id.encode(), partitions, partitions)
