"""What a job will run as: batch arithmetic, parameter and FLOP counts (torch-free, per
family, with sliding windows), the estimate of memory and time, the memory fit against
the queue's devices, the optional packages and the grants it needs, and the plan the API
answers.
"""
