// data.cpp: (to be written)
