"""The replica: the pysyncobj boundary — submit, apply under the state lock, read;
pysyncobj's patched internals; group commit; consistent reads and exactly-once writes."""
