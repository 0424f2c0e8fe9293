"""The control protocol: pydantic messages, JSON frames, per-job secret."""

from slurm_elastic.wire.channel import Channel, connect, new_secret, parse_address, request
from slurm_elastic.wire.messages import Message, parse_message

__all__ = ["Channel", "Message", "connect", "new_secret", "parse_address", "parse_message", "request"]
