"""Operations on a stopped deployment (growing to more partitions)."""
