from aiokafka.partitioner import DefaultPartitioner

from dlqapp.core.partitioning import owner_partition


def test_owner_partition_matches_kafkas_default_key_partitioner():
    partitions = list(range(6))
    for i in range(500):
        request_id = f"req-{i}"
        assert owner_partition(request_id, 6) == DefaultPartitioner()(request_id.encode(), partitions, partitions)


def test_a_request_is_routed_to_the_worker_owning_its_partition():
    from dlqapp.api.cluster import owner_url

    hosts = {
        "http://a:1": {"app-requests-changelog": [0, 2]},
        "http://b:2": {"app-requests-changelog": [1]},
        "http://c:3": {},
    }
    assert [owner_url(hosts, p) for p in (0, 1, 2)] == ["http://a:1", "http://b:2", "http://a:1"]
    assert owner_url(hosts, 3) is None  # nobody owns it now (mid-rebalance): the caller answers 503
