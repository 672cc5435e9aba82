"""The decode loop: a request and the pair (step), the stages, node-log rows, the solo loop (engine), a batch's."""
