"""Everything that runs in a job's Ray Job driver and in its Ray Train workers."""
