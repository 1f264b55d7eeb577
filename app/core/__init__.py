"""The pure decision core: typed snapshots in, decisions with reasons out. No I/O, no clock."""
