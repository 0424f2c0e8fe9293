"""The training state as tensors and JSON (`state`), the user's own part of it (`userstate`), and its files: the
job's disaster-recovery checkpoints (`checkpoint`), their format without pickle (`ckptformat`) and private
files in a directory others may write to (`ckptfiles`)."""
