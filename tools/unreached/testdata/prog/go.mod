module example.com/prog

go 1.26.0
