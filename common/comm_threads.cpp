// comm_threads.cpp: (to be written)
