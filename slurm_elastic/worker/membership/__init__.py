"""Membership and recovery: one worker's control connection to the coordinator (`control`), each generation's
store and process group and the way into the next one (`runtime`), interruptible collectives (`comm`) and the
threads that make blocking calls interruptible (`helpers`)."""
