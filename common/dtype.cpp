// dtype.cpp: (to be written)
