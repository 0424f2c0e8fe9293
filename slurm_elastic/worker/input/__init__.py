"""Data input: a data set and a DataLoader's settings (`data`), batches read ahead on a thread (`prefetch`) or in
loader processes (`loadpool`)."""
