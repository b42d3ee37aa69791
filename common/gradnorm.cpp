// gradnorm.cpp: (to be written)
