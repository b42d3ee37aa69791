// comm.cpp: (to be written)
