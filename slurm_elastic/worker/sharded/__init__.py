"""FSDP2 (`fully_shard`) under ElasticJob: each generation's mesh, FSDP2's collectives over the generation's
group, re-sharding to any world size from peers' memory, mirrored shards, and sharded checkpoints."""
