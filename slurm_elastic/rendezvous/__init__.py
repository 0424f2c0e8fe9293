"""The job's rendezvous store: the keys that wire each generation's process group (and the state layout a
joiner reads), held in the coordinator's memory and reached only over connections that proved the job's
secret. `state` is the pure state machine, `service` serves it on the coordinator's loop, `client` is
the torch Store the workers use (it imports torch; the other two do not)."""
