"""The schedule: the steps' order, the read-ahead window, the memory timeline and its
peak, fitted under a budget and compared with the machine."""
