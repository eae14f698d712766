from django.shortcuts import render


def run_list(request):
    return render(request, "runs/run_list.html")
